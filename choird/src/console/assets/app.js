// Choir console: live updates from choird's event stream. Every value is
// set as text (textContent), never parsed as HTML.
"use strict";
(function () {
  var live = document.getElementById("live");
  if (!window.EventSource || !document.querySelector("[data-agent-state]") && !live) {
    return;
  }
  var source = new EventSource("/events");
  source.addEventListener("agents", function (e) {
    var agents = JSON.parse(e.data);
    agents.forEach(function (a) {
      var state = document.querySelector('[data-agent-state="' + CSS.escape(a.id) + '"]');
      if (state) { state.textContent = a.state; }
      var lanes = document.querySelector('[data-agent-lanes="' + CSS.escape(a.id) + '"]');
      if (lanes) {
        lanes.textContent = a.lanes.map(function (l) {
          return l.lane + " " + l.state + " · " + l.steps + " steps · " + l.tokens + " tokens" +
            (l.detail ? " — " + l.detail : "");
        }).join(" | ");
      }
    });
  });
  source.addEventListener("commit", function (e) {
    if (!live) { return; }
    var ev = JSON.parse(e.data);
    var li = document.createElement("li");
    li.className = "event";
    li.textContent = ev.agent + " #" + ev.seq + " " + ev.lane + " " + ev.kind + " " + ev.tool + " " + ev.outcome;
    live.insertBefore(li, live.firstChild);
    while (live.children.length > 200) { live.removeChild(live.lastChild); }
  });
})();
