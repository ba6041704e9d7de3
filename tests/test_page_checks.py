"""The built-page checks catch what a reader caught: raw math, a change between equal numbers, a stray table."""
from pathlib import Path

from companion.book import page_checks as P


def _page(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "chapter.html"
    path.write_text(f"<html><body><main>{body}</main></body></html>", encoding="utf-8")
    return path


def test_raw_math_is_found_outside_math_and_code_only(tmp_path):
    page = _page(tmp_path, "<p>a price of about $10^{-6}$ relative</p>"
                           "<p><span class='math notranslate nohighlight'>\\(V(k)\\)</span></p>"
                           "<pre>x = '$a$'</pre><code>$b$</code><p>costs $5 and $6 apiece</p>")
    found = P.raw_math(page)
    assert found == ["chapter.html: raw math '$10^{-6}$'"], found


def test_a_change_between_equal_numbers_is_found(tmp_path):
    page = _page(tmp_path, "<p>its median moves from 0.5011 to 0.5011 nats; the mean from 0.50 to 0.51;"
                           " steps from 12 to 120</p>")
    found = P.non_changes(page)
    assert len(found) == 1 and "0.5011 to 0.5011" in found[0], found


def test_a_table_above_the_heading_of_its_own_section_is_found(tmp_path):
    stray = ("<section id='a'><h2>A</h2><p>text</p><table id='tbl-clock'></table></section>"
             "<section id='b'><h2>On the clock</h2><p>See <a href='#tbl-clock'>Table 1</a>.</p></section>")
    found = P.misplaced_tables(_page(tmp_path, stray))
    assert len(found) == 1 and "tbl-clock" in found[0] and "On the clock" in found[0], found
    home = ("<section id='b'><h2>On the clock</h2><table id='tbl-clock'></table>"
            "<section id='c'><h3>Sub</h3><p>See <a href='#tbl-clock'>Table 1</a>.</p></section></section>")
    assert P.misplaced_tables(_page(tmp_path, home)) == []


def test_check_pages_walks_the_build_and_skips_static_files(tmp_path):
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "x.html").write_text("<main><p>$a$</p></main>")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "07.html").write_text("<main><p>from 3 to 3 steps, $b^2$</p></main>")
    found = P.check_pages(tmp_path)
    assert len(found) == 2 and all(f.startswith("07.html") for f in found), found
