// The readable text of the page (run in an isolated world, so the page's
// own scripts cannot change what this code sees of the DOM's prototypes).
// Main content first (main, article, [role=main]; else the body); scripts,
// styles and hidden elements dropped; links numbered [n]; form fields shown
// with a selector to use with "type". MAX is replaced by the caller.
(() => {
  const MAX = __MAX__;
  const root = document.querySelector('main, article, [role=main]') || document.body || document.documentElement;
  const skip = new Set(['SCRIPT', 'STYLE', 'NOSCRIPT', 'TEMPLATE', 'SVG', 'CANVAS', 'IFRAME', 'OBJECT', 'EMBED', 'HEAD']);
  const block = /^(P|DIV|SECTION|ARTICLE|ASIDE|H[1-6]|LI|UL|OL|DL|DT|DD|TR|TABLE|BR|HR|HEADER|FOOTER|NAV|MAIN|FORM|FIELDSET|BLOCKQUOTE|PRE|FIGURE|FIGCAPTION)$/;
  const links = [];
  let out = '';
  const selectorOf = (el) => {
    if (el.id) return '#' + CSS.escape(el.id);
    const name = el.getAttribute('name');
    if (name) return el.tagName.toLowerCase() + '[name="' + name.replace(/["\\]/g, '\\$&') + '"]';
    return el.tagName.toLowerCase();
  };
  const walk = (n) => {
    if (out.length > MAX) return;
    if (n.nodeType === 3) { out += n.nodeValue; return; }
    if (n.nodeType !== 1) return;
    const tag = n.tagName.toUpperCase();
    if (skip.has(tag)) return;
    const st = window.getComputedStyle(n);
    if (st && (st.display === 'none' || st.visibility === 'hidden')) return;
    const isBlock = block.test(tag);
    if (isBlock) out += '\n';
    if (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT') {
      const type = (n.getAttribute('type') || tag.toLowerCase()).toLowerCase();
      if (type !== 'hidden') {
        const label = n.getAttribute('placeholder') || n.getAttribute('aria-label') || '';
        out += ' [field ' + selectorOf(n) + ' type=' + type + (label ? ' "' + label + '"' : '') + '] ';
      }
      return;
    }
    if (tag === 'BUTTON') out += ' [button ' + selectorOf(n) + '] ';
    if (tag === 'A' && n.href) {
      links.push(n.href);
      out += '[' + links.length + '] ';
    }
    if (tag === 'IMG' && n.alt) out += '[image: ' + n.alt + ']';
    for (const c of n.childNodes) walk(c);
    if (isBlock) out += '\n';
  };
  walk(root);
  const text = out.replace(/[ \t\u00a0]+/g, ' ').replace(/ *\n */g, '\n').replace(/\n{3,}/g, '\n\n').trim();
  return JSON.stringify({ title: document.title, url: location.href, text, links, truncated: out.length > MAX });
})()
