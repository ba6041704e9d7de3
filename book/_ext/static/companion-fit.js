// Companion book: a display equation or a table a little wider than the text column is set in
// a smaller font until it fits, down to 75 % (12 px, 9 pt); anything wider keeps scrolling, and
// tests/test_book_browser.py reports it as overflow. Figures are linked to their full-size image.
(function () {
  const MIN_SCALE = 0.75;
  function shrink(el, box) {
    let scale = 1;
    while (box.clientWidth && box.scrollWidth > box.clientWidth + 1 && scale > MIN_SCALE + 1e-9) {
      scale = Math.max(MIN_SCALE, scale - 0.05);
      el.style.fontSize = Math.round(scale * 100) + '%';
    }
  }
  function fit() {
    document.querySelectorAll('article mjx-container[display="true"]').forEach(m => shrink(m, m));
    document.querySelectorAll('article .pst-scrollable-table-container').forEach(c => {
      const t = c.querySelector('table');
      if (t) shrink(t, c);
    });
  }
  // Every figure's image opens the full-size file on tap or click (figure text is small on a
  // phone); an image already inside a link keeps its link.
  function linkFigures() {
    document.querySelectorAll('article figure img').forEach(img => {
      if (img.closest('a')) return;
      // a figure with a phone variant sits in a <picture>: the link wraps the picture, and opens the
      // figure as drawn (the wide one)
      const box = img.parentNode.tagName === 'PICTURE' ? img.parentNode : img;
      const a = document.createElement('a');
      a.href = img.getAttribute('src');
      a.className = 'companion-full-size';
      a.title = 'Open the figure at full size';
      box.parentNode.insertBefore(a, box);
      a.appendChild(box);
    });
  }
  // A table wider than its box scrolls inside it: a shadow on the side with more to see and a
  // "scroll" hint above it say so (the hint goes once the reader has scrolled to the end).
  function markScrollingTables() {
    document.querySelectorAll('article .pst-scrollable-table-container').forEach(box => {
      const update = () => {
        const more = box.scrollWidth - box.clientWidth;
        box.classList.toggle('companion-scrolls', more > 1);
        box.classList.toggle('companion-more-right', more > 1 && box.scrollLeft < more - 1);
        box.classList.toggle('companion-more-left', more > 1 && box.scrollLeft > 1);
        let hint = box.previousElementSibling;
        if (!(hint && hint.classList.contains('companion-scroll-hint'))) hint = null;
        if (more > 1 && !hint) {
          hint = document.createElement('div');
          hint.className = 'companion-scroll-hint';
          hint.setAttribute('aria-hidden', 'true');
          hint.textContent = 'Table wider than the screen: scroll sideways \u2192';
          box.parentNode.insertBefore(hint, box);
        } else if (more <= 1 && hint) {
          hint.remove();
        }
      };
      if (!box.dataset.companionScroll) {
        box.dataset.companionScroll = '1';
        box.addEventListener('scroll', update, {passive: true});
        window.addEventListener('resize', update);
      }
      update();
    });
  }
  // Long dotted names may break after a dot, so that they wrap at a name boundary instead of being
  // cut or squeezing their neighbours: in the right-hand contents (the API page) and in a table's
  // code (the API page's entry points, whose description column was a few characters wide on a
  // phone). <wbr> marks the break without adding a character, so a copied name stays intact.
  function breakDottedNames() {
    const names = '.bd-sidebar-secondary code span.pre, .bd-sidebar-secondary code, ' +
                  'article table td code span.pre, article table td code';
    document.querySelectorAll(names).forEach(el => {
      if (el.children.length || !/\w\.\w/.test(el.textContent)) return;
      const parts = el.textContent.split('.');
      el.textContent = '';
      parts.forEach((part, i) => {
        el.appendChild(document.createTextNode(i < parts.length - 1 ? part + '.' : part));
        if (i < parts.length - 1) el.appendChild(document.createElement('wbr'));
      });
    });
  }
  document.addEventListener('DOMContentLoaded', linkFigures);
  document.addEventListener('DOMContentLoaded', breakDottedNames);
  window.addEventListener('load', () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fit).then(markScrollingTables);
    } else {
      fit();
      markScrollingTables();
    }
  });
})();
