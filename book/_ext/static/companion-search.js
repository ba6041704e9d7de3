// Search results without raw TeX.
//
// Sphinx's search page shows each hit's title (from the search index, where math is kept as TeX
// inside <span class="math">) and a snippet cut from the page's text (its math again TeX, e.g.
// "\(\rho^* \ge \Delta^2/(2s)\)"). MathJax cannot typeset a snippet (a 240-character cut may
// split an equation), so both are turned into plain text with Unicode symbols instead:
// "ρ* ≥ Δ²/(2s)". The same conversion serves titles and snippets, so they read alike.
(() => {
  "use strict";

  const SYMBOLS = {
    alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ϵ", varepsilon: "ε", zeta: "ζ", eta: "η",
    theta: "θ", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ", pi: "π", rho: "ρ", sigma: "σ",
    tau: "τ", phi: "ϕ", varphi: "φ", chi: "χ", psi: "ψ", omega: "ω", Gamma: "Γ", Delta: "Δ",
    Theta: "Θ", Lambda: "Λ", Pi: "Π", Sigma: "Σ", Phi: "Φ", Psi: "Ψ", Omega: "Ω",
    le: "≤", leq: "≤", ge: "≥", geq: "≥", ne: "≠", neq: "≠", approx: "≈", sim: "∼", simeq: "≃",
    equiv: "≡", propto: "∝", ll: "≪", gg: "≫", infty: "∞", cdot: "·", times: "×", pm: "±", mp: "∓",
    in: "∈", notin: "∉", subset: "⊂", subseteq: "⊆", cup: "∪", cap: "∩", setminus: "∖",
    emptyset: "∅", varnothing: "∅", forall: "∀", exists: "∃", neg: "¬", land: "∧", lor: "∨",
    to: "→", rightarrow: "→", leftarrow: "←", Rightarrow: "⇒", Leftarrow: "⇐", iff: "⇔",
    Leftrightarrow: "⇔", mapsto: "↦", sum: "∑", prod: "∏", int: "∫", partial: "∂", nabla: "∇",
    ldots: "…", dots: "…", cdots: "⋯", star: "⋆", ast: "∗", circ: "∘", ell: "ℓ", top: "⊤",
    mid: "|", vert: "|", lvert: "|", rvert: "|", Vert: "‖", lVert: "‖", rVert: "‖", "|": "‖",
    langle: "⟨", rangle: "⟩", lfloor: "⌊", rfloor: "⌋", lceil: "⌈", rceil: "⌉",
    quad: " ", qquad: " ", ",": " ", ";": " ", ":": " ", " ": " ", "!": "", "\\": " ",
    "{": "{", "}": "}", "%": "%", "$": "$", "&": "&", "#": "#", "_": "_",
  };
  // Commands whose argument is shown as it is.
  const WRAPPERS = new Set([
    "mathrm", "mathit", "mathbf", "mathsf", "mathtt", "mathcal", "mathbb", "mathfrak", "boldsymbol",
    "text", "textrm", "textit", "textbf", "texttt", "operatorname", "mbox", "displaystyle", "underbrace",
    "overbrace",
  ]);
  // Size and spacing commands that show nothing.
  const SILENT = new Set([
    "left", "right", "big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr",
    "middle", "nonumber", "notag", "limits", "nolimits", "textstyle", "scriptstyle",
  ]);
  const ACCENTS = { hat: "\u0302", widehat: "\u0302", tilde: "\u0303", widetilde: "\u0303", bar: "\u0304",
                    overline: "\u0305", vec: "\u20d7", dot: "\u0307", ddot: "\u0308" };
  const SUP = Object.fromEntries([..."0123456789+-=()ni"].map((c, k) => [c, "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿⁱ"[k]]));
  Object.assign(SUP, { "−": "⁻", "*": "*", "′": "′", "∗": "*" });
  const SUB = Object.fromEntries([..."0123456789+-=()aehijklmnoprstuvx"].map(
    (c, k) => [c, "₀₁₂₃₄₅₆₇₈₉₊₋₌₍₎ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ"[k]]));
  Object.assign(SUB, { "−": "₋" });

  // One TeX formula (with or without its \( \), \[ \] or $ delimiters) as plain text.
  const texToText = (tex) => {
    const s = tex.trim()
      .replace(/^(\\\(|\\\[|\$\$|\$)/, "")
      .replace(/(\\\)|\\\]|\$\$|\$)$/, "");
    let i = 0;
    const skipSpace = () => { while (s[i] === " " || s[i] === "\n" || s[i] === "\t") i++; };
    // a {group} or a single symbol, converted
    const arg = () => {
      skipSpace();
      if (s[i] === "{") { i++; return seq("}"); }
      return atom();
    };
    // a {group} as written (environment names)
    const rawArg = () => {
      skipSpace();
      if (s[i] !== "{") return s[i++] || "";
      const end = s.indexOf("}", i);
      const out = s.slice(i + 1, end < 0 ? s.length : end);
      i = end < 0 ? s.length : end + 1;
      return out;
    };
    // parenthesise what is more than one number or one (scripted) name: \frac{a+b}{2s} reads (a+b)/(2s)
    const group = (x) => (/^(\p{Nd}+(\.\p{Nd}+)?|\p{L}[\p{L}\p{M}\p{No}*′]*)$/u.test(x) ? x : `(${x})`);
    const script = (x, table, mark) => {
      const chars = [...x];
      if (chars.length && chars.every((c) => c in table)) return chars.map((c) => table[c]).join("");
      return mark + group(x);
    };
    const command = (name) => {
      if (name === "frac" || name === "dfrac" || name === "tfrac") {
        const a = arg();
        const b = arg();
        return `${group(a)}/${group(b)}`;
      }
      if (name === "sqrt") return "√" + group(arg());
      if (name === "begin" || name === "end") { rawArg(); return " "; }
      if (Object.prototype.hasOwnProperty.call(SYMBOLS, name)) return SYMBOLS[name];
      if (WRAPPERS.has(name)) return arg();
      if (SILENT.has(name)) return "";
      if (Object.prototype.hasOwnProperty.call(ACCENTS, name)) return arg() + ACCENTS[name];
      return name; // \log, \exp, \max, \min, \KL and anything unknown: the name itself
    };
    const atom = () => {
      const c = s[i];
      if (c === undefined) return "";
      if (c === "\\") {
        const m = /^\\([a-zA-Z]+|[\s\S])/.exec(s.slice(i));
        i += m[0].length;
        return command(m[1]);
      }
      i++;
      if (c === "{") return seq("}");
      if (c === "^") return script(arg(), SUP, "^");
      if (c === "_") return script(arg(), SUB, "_");
      if (c === "'") return "′";
      if (c === "~" || c === "&") return " ";
      if (c === "-") return "−";
      return c;
    };
    const seq = (close) => {
      let out = "";
      while (i < s.length) {
        if (close && s[i] === close) { i++; break; }
        out += atom();
      }
      return out;
    };
    return seq(null).replace(/\s+/g, " ").trim();
  };
  window.companionTexToText = texToText;

  // TeX still in math elements (MathJax has not typeset them): replace it by its text.
  const MATH_SOURCE = /^\s*(\\\(|\\\[|\$)/;
  const untex = (root) => {
    root.querySelectorAll(".math").forEach((el) => {
      if (!el.querySelector("mjx-container") && MATH_SOURCE.test(el.textContent)) {
        el.textContent = texToText(el.textContent);
      }
    });
  };
  window.companionUntex = untex;

  const patchSearch = () => {
    // `Search` (searchtools.js) exists only on the search page.
    if (typeof Search === "undefined" || !Search.htmlToText || Search.companionPatched) return;
    const htmlToText = Search.htmlToText;
    Search.htmlToText = (htmlString, anchor) => {
      const doc = new DOMParser().parseFromString(htmlString, "text/html");
      // The theme's print-only header repeats the title with its TeX bare ("the \log 2 ceiling")
      // and the page's table of contents; a reader never sees it on screen.
      doc.querySelectorAll(".onlyprint").forEach((el) => el.remove());
      untex(doc);
      return htmlToText(doc.documentElement.outerHTML, anchor);
    };
    Search.companionPatched = true;
    // Titles come from the index as HTML with TeX in them: convert each hit as it is listed.
    const results = document.getElementById("search-results") || document.body;
    new MutationObserver(() => untex(results)).observe(results, { childList: true, subtree: true });
  };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", patchSearch);
  } else {
    patchSearch();
  }
})();
