// Companion book: a display equation or a table a little wider than the text column is set in
// a smaller font until it fits, down to 75 % (12 px, 9 pt); anything wider keeps scrolling, and
// tests/test_book_browser.py reports it as overflow.
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
  window.addEventListener('load', () => {
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(fit);
    } else {
      fit();
    }
  });
})();
