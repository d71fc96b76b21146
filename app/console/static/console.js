// Counts down every "time left" between the server's refreshes. Each element says how many
// seconds were left when the server drew it; counting from when the browser first saw it
// keeps the display right whatever the browser's clock says.
(function () {
  "use strict";
  var seen = new WeakMap();

  function format(seconds) {
    var s = Math.floor(seconds);
    var d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    var m = Math.floor((s % 3600) / 60), r = s % 60;
    var two = function (n) { return (n < 10 ? "0" : "") + n; };
    if (d) return d + "d" + (h ? " " + h + "h" : "");
    if (h) return h + "h" + (m ? " " + two(m) + "m" : "");
    if (m) return m + "m" + (r ? " " + two(r) + "s" : "");
    return r + "s";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("[data-left]").forEach(function (el) {
      if (!seen.has(el)) seen.set(el, now);
      var left = parseFloat(el.getAttribute("data-left")) - (now - seen.get(el)) / 1000;
      el.textContent = left <= 0 ? "overdue" : format(left);
      el.classList.toggle("soon", left > 0 && left < 120);
    });
  }

  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);
  document.addEventListener("htmx:afterSettle", tick);
})();
