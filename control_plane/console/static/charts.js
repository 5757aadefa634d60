// Telemetry charts: the last hour from /ui/telemetry/history, then live points from the
// server-sent events of /ui/telemetry/stream. No inline script: the page's CSP forbids it.
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root || !window.uPlot) { return; }
  var HOUR_S = 3600;
  var METRICS = {
    rps: { series: [{ label: "req/s", stroke: "#1f77b4" }] },
    errors: { series: [{ label: "errors", stroke: "#d62728" }] },
    latency: { series: [{ label: "p50 ms", stroke: "#2ca02c" }, { label: "p99 ms", stroke: "#ff7f0e" }] }
  };
  var cards = {};

  function columns(points, metric) {
    var t = points.map(function (p) { return p.t; });
    if (metric === "rps") { return [t, points.map(function (p) { return p.requests_per_s; })]; }
    if (metric === "errors") { return [t, points.map(function (p) { return p.error_rate; })]; }
    return [t, points.map(function (p) { return p.p50_ms; }), points.map(function (p) { return p.p99_ms; })];
  }

  function redraw(entry) {
    var newest = entry.points.length ? entry.points[entry.points.length - 1].t : 0;
    entry.points = entry.points.filter(function (p) { return p.t >= newest - HOUR_S; });
    entry.points.sort(function (a, b) { return a.t - b.t; });
    Object.keys(entry.plots).forEach(function (metric) {
      entry.plots[metric].setData(columns(entry.points, metric));
    });
    var last = entry.points[entry.points.length - 1];
    if (last) {
      entry.latest.textContent = last.requests_per_s.toFixed(1) + " req/s, errors " +
        (last.error_rate === null ? "n/a" : (last.error_rate * 100).toFixed(2) + " %") +
        ", p50 " + (last.p50_ms === null ? "n/a" : last.p50_ms.toFixed(1) + " ms") +
        ", p99 " + (last.p99_ms === null ? "n/a" : last.p99_ms.toFixed(1) + " ms");
    }
  }

  Array.prototype.forEach.call(root.querySelectorAll(".chart-card"), function (card) {
    var key = card.dataset.model + ":" + card.dataset.version;
    var entry = { points: [], plots: {}, latest: card.querySelector(".latest") };
    Array.prototype.forEach.call(card.querySelectorAll(".chart"), function (el) {
      var metric = el.dataset.metric;
      var opts = {
        width: Math.max(240, el.clientWidth || 320),
        height: 160,
        scales: { x: { time: true } },
        series: [{}].concat(METRICS[metric].series.map(function (s) {
          return { label: s.label, stroke: s.stroke, width: 2, spanGaps: false };
        }))
      };
      entry.plots[metric] = new window.uPlot(opts, columns([], metric), el);
    });
    cards[key] = entry;
    var url = "/ui/telemetry/history?model=" + encodeURIComponent(card.dataset.model) +
      "&version=" + encodeURIComponent(card.dataset.version);
    fetch(url, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : []; })
      .then(function (points) { entry.points = entry.points.concat(points); redraw(entry); });
  });

  if (Object.keys(cards).length) {
    var source = new EventSource(root.dataset.stream);
    source.onmessage = function (event) {
      var p = JSON.parse(event.data);
      var entry = cards[p.model + ":" + p.version];
      if (entry) { entry.points.push(p); redraw(entry); }
    };
    window.addEventListener("pagehide", function () { source.close(); });
  }
}());
