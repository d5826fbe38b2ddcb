// Charts of the job and roofline pages, drawn with Plotly.js (SVG traces only, no WebGL) from
// JSON embedded in the page.
(function () {
  "use strict";
  if (!window.Plotly) return;
  const CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["select2d", "lasso2d"] };
  const BASE = { margin: { l: 60, r: 20, t: 40, b: 50 }, font: { size: 12 }, paper_bgcolor: "rgba(0,0,0,0)",
    plot_bgcolor: "#fff", hovermode: "closest" };
  const layout = function (extra) { return Object.assign({}, BASE, extra); };
  // a legend under a plot with an x-axis title: at the bottom of the figure, below the title
  // (at y -0.2 of the plot it overlapped the title), in a bottom margin tall enough for both
  const LEGEND_BELOW = { margin: { l: 60, r: 20, t: 40, b: 84 },
    legend: { orientation: "h", yref: "container", y: 0, yanchor: "bottom", x: 0.5, xanchor: "center" } };
  const X_TITLE = function (text) { return { title: { text: text, standoff: 4 } }; };

  // A chart with nothing to draw yet shows a line of text in its box, in the page's flow; the
  // plot (if one was drawn before) is purged first and the text removed before plotting again,
  // so neither the text nor a stale plot spills over what follows.
  function placeholder(el, text) {
    Plotly.purge(el);
    el.innerHTML = "";
    const p = document.createElement("p");
    p.className = "muted chart-empty";
    p.textContent = text;
    el.appendChild(p);
  }

  function plot(el, traces, lay) {
    const empty = el.querySelector(".chart-empty");
    if (empty) empty.remove();
    Plotly.react(el, traces, lay, CONFIG);
  }

  function bestSoFar(el, d) {
    // the curve is of trial timings; the task's best (re-timed once the finalists were) is its own point
    const traces = [{ x: d.numbers, y: d.best, mode: "lines+markers", line: { shape: "hv", color: "#2b7bba" },
      marker: { size: 4 }, name: "best trial time so far", connectgaps: true }];
    if (d.final) traces.push({ x: [d.final.x], y: [d.final.ms], mode: "markers", marker: { size: 10, color: "#d7301f", symbol: "diamond" },
      name: d.final.measured === "retimed" ? "best, re-timed" : "best (trial time)" });
    plot(el, traces,
      layout(Object.assign({ title: { text: "Best trial time so far (ms)" }, xaxis: X_TITLE("trial"),
        yaxis: { title: { text: "ms" }, type: "log" }, showlegend: !!d.final }, LEGEND_BELOW)));
  }

  function trials(el, d) {
    const ok = d.outcomes.ok ? d.outcomes.ok.y.filter(function (y) { return y !== null; }) : [];
    const top = ok.length ? Math.max.apply(null, ok) * 1.3 : 1;
    const traces = Object.keys(d.outcomes).map(function (outcome) {
      const g = d.outcomes[outcome];
      const failed = outcome !== "ok";
      // a timeout is drawn at its time (its p50, or the run's limit it hit: the server's y),
      // with a marker of its own; other failures have no time and go on top
      const timeout = outcome === "timeout";
      const text = g.i.map(function (i) {
        const c = d.configs[i];
        return d.names.map(function (n, j) { return n + "=" + c[j]; }).join(" ") + (d.errors[i] ? "<br>" + d.errors[i] : "");
      });
      const y = g.y.map(function (v) { return !failed || (timeout && v !== null) ? v : top; });
      return { x: g.x, y: y, text: text, name: outcome,
        mode: "markers", type: "scatter", hovertemplate: "#%{x}: %{text}<extra>" + outcome + "</extra>",
        marker: { color: d.colours[outcome] || "#444", size: failed ? 8 : 6,
          symbol: timeout ? "hourglass" : (failed ? "x" : "circle") } };
    });
    plot(el, traces, layout(Object.assign({ title: { text: "Every trial by outcome (failures on top)" },
      xaxis: X_TITLE("trial"), yaxis: { title: { text: "p50 ms" }, type: "log" } }, LEGEND_BELOW)));
  }

  function importance(el, d) {
    const rows = d.importance.slice().reverse();
    if (!rows.length) { placeholder(el, "Parameter importance needs 3 successful trials."); return; }
    plot(el, [{ type: "bar", orientation: "h", x: rows.map(function (r) { return r.share; }),
      y: rows.map(function (r) { return r.param; }), marker: { color: "#4a9c7a" },
      hovertemplate: "%{y}: %{x:.0%} of the variance<extra></extra>" }],
      layout({ title: { text: "Parameter importance (share of log-time variance)" },
        xaxis: { range: [0, 1], tickformat: ".0%" },
        // the names set the left margin (a fixed 100 px cut PROGRAMS_PER_SM)
        yaxis: { automargin: true }, margin: { l: 20, r: 20, t: 40, b: 40 } }));
  }

  function parcoords(el, d) {
    const p = d.parcoords;
    if (!p.rows.length) { placeholder(el, "No successful trial to draw yet."); return; }
    const n = p.axes.length;
    const bins = 5;
    const colours = ["#1a9850", "#91cf60", "#fee08b", "#fc8d59", "#d73027"];
    const traces = [];
    for (let b = 0; b < bins; b++) {
      const x = [], y = [];
      for (let i = Math.floor(b * p.rows.length / bins); i < Math.floor((b + 1) * p.rows.length / bins); i++) {
        for (let a = 0; a < n; a++) { x.push(a); y.push(p.rows[i][a]); }
        x.push(null); y.push(null);
      }
      if (x.length) traces.push({ x: x, y: y, mode: "lines", type: "scatter", hoverinfo: "skip",
        line: { color: colours[b], width: 1 }, opacity: 0.55, name: ["fastest 20%", "", "", "", "slowest 20%"][b] || ("bin " + (b + 1)), showlegend: b === 0 || b === bins - 1 });
    }
    traces.reverse();  // the fastest drawn last, on top
    const annotations = [];
    p.axes.forEach(function (axis, a) {
      const vals = axis.values;
      vals.forEach(function (v, i) {
        const pos = a === n - 1 ? i : (vals.length > 1 ? i / (vals.length - 1) : 0.5);
        annotations.push({ x: a, y: pos, text: String(v), showarrow: false, xanchor: "left", xshift: 4, font: { size: 10, color: "#333" } });
      });
    });
    plot(el, traces, layout({ title: { text: "Configs tried (the " + p.rows.length + " fastest), one line each" },
      xaxis: { tickvals: p.axes.map(function (_, i) { return i; }), ticktext: p.axes.map(function (a) { return a.name; }),
        showgrid: true, gridcolor: "#999", zeroline: false, range: [-0.2, n - 0.6] },
      yaxis: { showticklabels: false, showgrid: false, zeroline: false, range: [-0.05, 1.05] },
      annotations: annotations, legend: { orientation: "h", y: -0.15 } }));
  }

  function roofline(el, data) {
    const pts = data.points, c = data.ceilings;
    const xs = pts.map(function (p) { return p.intensity; });
    const lo = Math.min.apply(null, xs.concat([1])) / 4, hi = Math.max.apply(null, xs.concat([1000])) * 4;
    const traces = [];
    if (c.tflops && c.gbps) {
      const ax = [], ay = [];
      for (let i = 0; i <= 80; i++) {
        const x = lo * Math.pow(hi / lo, i / 80);
        ax.push(x); ay.push(Math.min(c.tflops, c.gbps * x / 1000));
      }
      traces.push({ x: ax, y: ay, mode: "lines", name: "roof: " + Math.round(c.gbps) + " GB/s, " + Math.round(c.tflops) + " TFLOP/s",
        line: { color: "#333", width: 2 }, hoverinfo: "skip" });
    }
    const groups = {};
    pts.forEach(function (p) { (groups[p.kernel + " " + p.dtype] = groups[p.kernel + " " + p.dtype] || []).push(p); });
    Object.keys(groups).forEach(function (name) {
      const g = groups[name];
      traces.push({ x: g.map(function (p) { return p.intensity; }), y: g.map(function (p) { return p.tflops; }), mode: "markers",
        type: "scatter", name: name, marker: { size: 10 },
        text: g.map(function (p) { return p.shape + (p.of_roof ? " · " + Math.round(p.of_roof * 100) + "% of roof" : "") + "<br>" + p.config; }),
        hovertemplate: "%{text}<br>%{x:.1f} FLOP/B, %{y:.1f} TFLOP/s<extra>" + name + "</extra>" });
    });
    plot(el, traces, layout({ title: { text: data.device }, xaxis: { type: "log", title: { text: "arithmetic intensity (FLOP/byte)" } },
      yaxis: { type: "log", title: { text: "TFLOP/s" } }, legend: { orientation: "h", y: -0.2 } }));
  }

  function draw(box, d) {
    bestSoFar(box.querySelector('[data-chart="best"]'), d);
    trials(box.querySelector('[data-chart="trials"]'), d);
    importance(box.querySelector('[data-chart="importance"]'), d);
    parcoords(box.querySelector('[data-chart="parcoords"]'), d);
  }

  document.querySelectorAll("[data-charts]").forEach(function (box) {
    draw(box, JSON.parse(document.getElementById("chart-data-" + box.dataset.charts).textContent));
  });
  // a running job's page redraws a shape's charts with the data of each live refresh
  // (dashboard.js calls this)
  window.tunerDraw = draw;
  document.querySelectorAll("script.roofline-data").forEach(function (s) {
    roofline(document.getElementById(s.dataset.target), JSON.parse(s.textContent));
  });
})();
