"""The one registry of presets (companion/assets/presets.json): what loading and harvest planning read from it."""
from __future__ import annotations

import json

import pytest

from companion.certify.criteria import PAPER_CRITERIA
from companion.models import presets
from companion.models.loading import resolve_preset
from companion.models.weights import sources


def test_every_preset_names_parts_that_exist() -> None:
    known = sources()
    for name, preset in presets.PRESETS.items():
        for source in (preset.target_source, preset.drafter_source, preset.tokenizer_source):
            if source is None:
                continue
            if source.kind == "package_index":
                assert source.name in known, f"{name}: {source.name} is not in the package-index registry"
            elif source.kind in ("asset", "distilled"):
                assert source.folder.is_dir(), f"{name}: {source.folder} is not in the package"
    assert presets.FALLBACK_PRESET in presets.PRESETS


def test_the_harvest_reads_each_preset_as_before() -> None:
    """What the harvest hands to load_pair: a hub id, or the preset's own name for parts that must be made."""
    coder = presets.get_preset("qwen2.5-coder")
    assert (coder.target, coder.drafter, coder.tokenizer, coder.prompts) == ("qwen2.5-coder",) * 2 + (None, "chat-and-stdlib")
    assert presets.get_preset("qwen2.5-coder-0.5b").drafter is None
    assert coder.registry_models == ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
    assert presets.get_preset("smollm2").registry_models == ("smollm2-135m-instruct",)
    paper = presets.get_preset("paper-qwen3-4b")
    assert (paper.target, paper.drafter, paper.n_prompts, paper.min_prompt_tokens) == ("Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B", 500, 64)
    assert paper.criteria == PAPER_CRITERIA and paper.tree_widths == (1, 2, 4, 8) and paper.n_steps == 128
    closed, default = presets.get_preset("closed-world"), presets.get_preset("default")
    assert closed.embedded and default.embedded and not coder.embedded
    assert default.name == "default" and "former name of closed-world" in default.description
    assert list(presets.PRESETS)[:5] == ["qwen2.5-coder", "qwen2.5-coder-0.5b", "smollm2", "closed-world", "default"]


def test_loading_resolves_the_embedded_pair_and_hub_ids_without_making_anything() -> None:
    spec = resolve_preset("closed-world")
    assert spec is not None and spec.target.endswith("default_pair/target") and spec.drafter.endswith("default_pair/drafter")
    assert spec.tokenizer.endswith("default_pair/tokenizer")
    assert resolve_preset("default") == spec
    assert resolve_preset("paper-qwen3-1.7b").target == "Qwen/Qwen3-1.7B"
    assert resolve_preset("paper-qwen3-1.7b", with_drafter=False).drafter is None
    assert resolve_preset("no-such-preset") is None


@pytest.mark.parametrize("entry, fault", [
    ({"description": "x"}, "needs a description and a target"),
    ({"description": "x", "target": {"hub": "a/b"}}, "expected one of"),
    ({"description": "x", "target": {"pretrained": "a/b"}, "n_steps": True}, "n_steps"),
    ({"description": "x", "target": {"pretrained": "a/b"}, "colour": 1}, "unknown fields colour"),
    ({"description": "x", "target": {"distilled": "d"}}, "the target must be"),
])
def test_a_faulty_registry_is_refused_with_the_preset_named(entry, fault) -> None:
    with pytest.raises(ValueError, match=fault):
        presets.parse_presets({"presets": {"p": entry}}, "test.json")


def test_the_registry_file_is_the_data_the_module_reads() -> None:
    data = json.loads(presets.REGISTRY_FILE.read_text(encoding="utf-8"))
    assert presets.parse_presets(data) == {k: v for k, v in presets.PRESETS.items() if k in presets.BUILT_IN}
    with pytest.raises(ValueError, match="built in"):
        presets.register_preset("smollm2", "some/where")
