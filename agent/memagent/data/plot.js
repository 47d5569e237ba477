// memagent plot -o OUT.html: draws the data embedded in the page (script#memagent-data) on
// canvases. Self-contained: no library, no network. Labels and command lines are untrusted
// text: they reach the page through textContent only, never as markup.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("memagent-data").textContent);
  // As plot_mpl.PALETTE: a process's "colour" indexes it (null: a thin grey line).
  const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                   "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"];
  const OTHERS = "#bdbdbd", SEVERITY = { critical: "#d62728", warning: "#ff9f1c" };
  const TOGETHER = "#006d5b";  // as plot_mpl.TOGETHER: the total seen together
  const WORDS_APART = [0.13, 0.07];  // as plot_mpl.WORDS_APART
  const PAD = { left: 78, right: 16, top: 14, bottom: 26 };
  const hidden = new Set();
  const procs = data.processes.map((p) => Object.assign({}, p, {
    colour: p.colour === null ? OTHERS : PALETTE[p.colour % PALETTE.length], named: p.colour !== null }));
  const hasVram = procs.some((p) => p.vram.length > 0);
  const ends = [data.first, data.last].concat(data.exits.map((e) => e.time));
  const t0 = Math.min(...ends), t1 = Math.max(...ends), tpad = Math.max((t1 - t0) * 0.01, 1);
  const panels = [];

  function formatSize(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let v = n;
    for (let i = 0; i < units.length; i++) {
      if (Math.abs(v) < 1024 || i === units.length - 1) {
        if (i === 0) return Math.trunc(v) + "B";
        const digits = Math.abs(v) < 10 ? v.toFixed(2) : Math.abs(v) < 100 ? v.toFixed(1) : v.toFixed(0);
        return digits + " " + units[i];
      }
      v /= 1024;
    }
    return String(n);
  }
  const two = (n) => String(n).padStart(2, "0");
  const clock = (t) => { const d = new Date(t * 1000); return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds()); };
  const day = (t) => { const d = new Date(t * 1000); return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()); };

  function binaryTicks(top) {
    top = Math.max(top, 1);
    let step = 1;
    while (Math.ceil(top / step) > 6) step *= 2;  // as plot_data.binary_ticks
    const ticks = [];
    for (let i = 0; i <= Math.ceil(top / step); i++) ticks.push(i * step);
    return ticks;
  }
  function timeTicks(a, b, width) {
    const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
    const want = Math.max(2, Math.floor(width / 110));
    const step = steps.find((s) => (b - a) / s <= want) || 86400 * Math.ceil((b - a) / want / 86400);
    const ticks = [];
    const offset = new Date(a * 1000).getTimezoneOffset() * 60;  // round in local time
    for (let t = Math.ceil((a - offset) / step) * step + offset; t <= b; t += step) ticks.push(t);
    return ticks;
  }

  function panel(canvas, height, what, series, extras, room) {
    let top = 1;  // no spread of a long array into Math.max: it has a limit on arguments
    for (const s of series) for (const pt of s.points) top = Math.max(top, pt[1]);
    for (const v of extras) top = Math.max(top, v || 0);
    const ticks = binaryTicks(top);
    return { canvas, height, what, series, ymax: Math.max(ticks[ticks.length - 1], top * room), ticks };
  }
  function build() {
    const sums = [{ kind: "sum", points: data.sum_peaks }];
    if (data.judged_sum_peaks && data.judged_sum_peaks.length) sums.push({ kind: "sum", judged: true, points: data.judged_sum_peaks });
    if (data.together && data.together.length) sums.push({ kind: "sum", judged: true, together: true, points: data.together });
    panels.push(panel(document.getElementById("box"), 200, "\u03a3 peaks", sums,
                      data.capacity_shown ? [data.capacity_bytes] : [], 1.08));
    const rss = procs.map((p) => ({ kind: "rss", proc: p, points: p.rss, peak: [p.peak_time, p.peak_bytes] }));
    panels.push(panel(document.getElementById("rss"), 400, "RSS", rss, procs.map((p) => p.peak_bytes), 1.15));
    if (hasVram) {
      const vram = procs.filter((p) => p.vram.length).map((p) => ({ kind: "vram", proc: p, points: p.vram,
        peak: [p.vram_peak_time, p.vram_peak_bytes] }));
      panels.push(panel(document.getElementById("vram"), 220, "GPU memory", vram,
                        procs.map((p) => p.vram_peak_bytes || 0), 1.15));
    } else {
      document.getElementById("vram").remove();
    }
  }

  function draw(pl) {
    const c = pl.canvas, ratio = window.devicePixelRatio || 1;
    const w = c.clientWidth;
    c.width = w * ratio; c.height = pl.height * ratio; c.style.height = pl.height + "px";
    const g = c.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, pl.height);
    const x = (t) => PAD.left + (t - (t0 - tpad)) / (t1 - t0 + 2 * tpad) * (w - PAD.left - PAD.right);
    const y = (v) => pl.height - PAD.bottom - v / pl.ymax * (pl.height - PAD.top - PAD.bottom);
    pl.x = x; pl.y = y;
    g.font = "11px system-ui, sans-serif"; g.fillStyle = "#444"; g.strokeStyle = "#e5e5e5"; g.lineWidth = 1;
    g.textAlign = "right"; g.textBaseline = "middle";
    for (const v of pl.ticks) {
      g.beginPath(); g.moveTo(PAD.left, y(v)); g.lineTo(w - PAD.right, y(v)); g.stroke();
      g.fillText(formatSize(v), PAD.left - 6, y(v));
    }
    g.save(); g.translate(14, (pl.height - PAD.bottom + PAD.top) / 2); g.rotate(-Math.PI / 2);
    g.textAlign = "center"; g.fillText(pl.what, 0, 0); g.restore();
    g.textAlign = "center"; g.textBaseline = "top";
    const tt = timeTicks(t0, t1, w - PAD.left - PAD.right);
    const multiDay = day(t0) !== day(t1);
    for (const t of tt) {
      g.beginPath(); g.moveTo(x(t), PAD.top); g.lineTo(x(t), pl.height - PAD.bottom); g.stroke();
      g.fillText(multiDay ? day(t).slice(5) + " " + clock(t).slice(0, 5) : clock(t), x(t), pl.height - PAD.bottom + 6);
    }
    for (const a of data.alerts) {
      g.strokeStyle = SEVERITY[a.severity] || "#7f7f7f"; g.lineWidth = 1.2;
      g.setLineDash(a.state === "firing" ? [] : [2, 3]);
      g.beginPath(); g.moveTo(x(a.time), PAD.top); g.lineTo(x(a.time), pl.height - PAD.bottom); g.stroke();
      if (pl === panels[0] && a.labelled) {
        g.save(); g.translate(x(a.time) + 3, PAD.top + 2); g.rotate(Math.PI / 2);
        g.fillStyle = g.strokeStyle; g.textAlign = "left"; g.textBaseline = "bottom"; g.fillText(a.kind, 0, 0);
        g.restore();
      }
    }
    g.setLineDash([]);
    if (pl === panels[0] && data.capacity_shown) {
      g.strokeStyle = "#000"; g.setLineDash([8, 3, 2, 3]);
      g.beginPath(); g.moveTo(PAD.left, y(data.capacity_bytes)); g.lineTo(w - PAD.right, y(data.capacity_bytes)); g.stroke();
      g.setLineDash([]); g.fillStyle = "#000"; g.textAlign = "left"; g.textBaseline = "bottom";
      g.fillText("capacity " + formatSize(data.capacity_bytes), PAD.left + 4, y(data.capacity_bytes) - 2);
    }
    const order = pl.series.slice().sort((a, b) => (a.proc && a.proc.named ? 1 : 0) - (b.proc && b.proc.named ? 1 : 0));
    for (const s of order) {
      if (hidden.has(key(s)) || !s.points.length) continue;
      g.strokeStyle = s.together ? TOGETHER : s.kind === "sum" ? "#333" : s.proc.colour;
      g.lineWidth = s.judged ? 2.2 : s.kind === "sum" || s.proc.named ? 1.6 : 0.8;
      g.setLineDash(s.kind === "sum" && !s.judged ? [6, 4] : []);
      g.beginPath();
      // A gap (no data: the daemon stopped, the process not watched) breaks the line.
      const gap = s.judged ? data.judged_gap_seconds : data.gap_seconds;
      s.points.forEach((pt, i) => (i && pt[0] - s.points[i - 1][0] <= gap
        ? g.lineTo(x(pt[0]), y(pt[1])) : g.moveTo(x(pt[0]), y(pt[1]))));
      g.stroke();
    }
    g.setLineDash([]);
    const placed = [], plotW = w - PAD.left - PAD.right, plotH = pl.height - PAD.top - PAD.bottom;
    const byPeak = order.filter((s) => s.kind !== "sum").sort((a, b) => (b.peak[1] || 0) - (a.peak[1] || 0));
    for (const s of byPeak) {
      if (hidden.has(key(s))) continue;
      const p = s.proc;
      if (s.peak[0] !== null && s.peak[1] !== null) {
        const px = x(s.peak[0]), py = y(s.peak[1]), r = p.named ? 5 : 3;
        g.fillStyle = p.colour; g.strokeStyle = p.named ? "#000" : p.colour; g.lineWidth = 0.6;
        g.beginPath(); g.moveTo(px - r, py - 1.6 * r); g.lineTo(px + r, py - 1.6 * r); g.lineTo(px, py); g.closePath();
        g.fill(); g.stroke();
        const fx = (px - PAD.left) / plotW, fy = (pl.height - PAD.bottom - py) / plotH;
        if (p.named && !placed.some((q) => Math.abs(q[0] - fx) < WORDS_APART[0] && Math.abs(q[1] - fy) < WORDS_APART[1])) {
          placed.push([fx, fy]);
          g.textAlign = "center"; g.textBaseline = "bottom"; g.font = "11px system-ui, sans-serif";
          g.fillText(formatSize(s.peak[1]) + " at " + clock(s.peak[0]), px, py - 10);
        }
      }
      if (s.kind === "rss" && p.exited_at !== null && p.rss.length) {
        const ex = x(p.exited_at), ey = y(p.rss[p.rss.length - 1][1]);
        g.strokeStyle = p.colour; g.lineWidth = 2.5;
        g.beginPath(); g.moveTo(ex - 5, ey - 5); g.lineTo(ex + 5, ey + 5); g.moveTo(ex + 5, ey - 5); g.lineTo(ex - 5, ey + 5);
        g.stroke();
      }
    }
    if (pl.hover) {
      g.strokeStyle = "#000"; g.lineWidth = 1.5;
      g.beginPath(); g.arc(x(pl.hover[0]), y(pl.hover[1]), 5, 0, 2 * Math.PI); g.stroke();
    }
  }
  const key = (s) => (s.kind === "sum" ? (s.together ? "together" : s.judged ? "judged" : "sum") : s.proc.pid + "/" + s.proc.start_time);
  const redraw = () => panels.forEach(draw);

  function nearest(pl, mx, my) {
    let best = null, bestD = 400;  // within 20 px
    for (const s of pl.series) {
      if (hidden.has(key(s))) continue;
      const pts = s.points;
      let lo = 0, hi = pts.length - 1;
      if (hi < 0) continue;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (pl.x(pts[mid][0]) < mx) lo = mid + 1; else hi = mid; }
      for (let i = Math.max(0, lo - 3); i <= Math.min(pts.length - 1, lo + 3); i++) {
        const dx = pl.x(pts[i][0]) - mx, dy = pl.y(pts[i][1]) - my, d = dx * dx + dy * dy;
        if (d < bestD) { bestD = d; best = { s, pt: pts[i] }; }
      }
    }
    return best;
  }
  function hover(pl, ev) {
    const tip = document.getElementById("tip"), r = pl.canvas.getBoundingClientRect();
    const hit = nearest(pl, ev.clientX - r.left, ev.clientY - r.top);
    panels.forEach((p) => { p.hover = null; });
    if (hit) {
      pl.hover = hit.pt;
      const who = hit.s.kind === "sum" ? (hit.s.together ? "seen together" : hit.s.judged ? "\u03a3 peaks, the daemon's" : "\u03a3 peaks, raw")
        : hit.s.proc.title + " (" + hit.s.proc.pid + ")";
      tip.textContent = who + "\n" + day(hit.pt[0]) + " " + clock(hit.pt[0]) + "\n" +
        (hit.s.kind === "vram" ? "GPU " : hit.s.kind === "sum" ? "" : "RSS ") + formatSize(hit.pt[1]);
      const box = document.getElementById("plot").getBoundingClientRect();
      tip.style.left = (r.left - box.left + pl.x(hit.pt[0]) + 12) + "px";
      tip.style.top = (r.top - box.top + pl.y(hit.pt[1]) + 12) + "px";
      tip.hidden = false;
    } else {
      tip.hidden = true;
    }
    redraw();
  }

  function legendItem(colour, text, title, k, dashed) {
    const li = document.createElement("li"), sw = document.createElement("span"), name = document.createElement("span");
    sw.className = "sw" + (dashed ? " dash" : ""); sw.style.background = colour;
    name.className = "name"; name.textContent = text; li.title = title;
    li.append(sw, name);
    if (k) li.addEventListener("click", () => {
      if (hidden.has(k)) hidden.delete(k); else hidden.add(k);
      li.classList.toggle("off", hidden.has(k)); redraw();
    });
    document.getElementById("legend").append(li);
  }
  function legend() {
    for (const p of procs) {
      legendItem(p.colour, p.title + " (" + p.pid + ") \u00b7 peak " + formatSize(p.peak_bytes) +
        (p.peak_time !== null ? " at " + clock(p.peak_time) : "") + (p.exited_at !== null ? " \u00b7 exited" : ""),
        p.cmdline.join(" ") || p.name, p.pid + "/" + p.start_time, false);
    }
    legendItem("#333", data.sum_label || "\u03a3 peaks", "the sum of the peaks of the processes alive at each sample", "sum", true);
    if (data.judged_sum_peaks && data.judged_sum_peaks.length) {
      legendItem("#333", data.judged_label, "the daemon's share-adjusted Σ peaks, from its headroom snapshots", "judged", false);
    }
    if (data.together && data.together.length) {
      legendItem(TOGETHER, data.together_label, "the watched processes' share-adjusted memory at the same moment, from the daemon's headroom snapshots", "together", false);
    }
    if (data.capacity_bytes !== null) {
      legendItem("#000", (data.capacity_words || ("capacity " + formatSize(data.capacity_bytes))) + (data.capacity_shown ? "" : " (off the scale)"),
                 "the host's memory", null, false);
    }
    for (const a of data.alerts) {
      legendItem(SEVERITY[a.severity] || "#7f7f7f", clock(a.time) + " " + a.severity + " " + a.kind + " " + a.state,
                 a.message, null, a.state !== "firing");
    }
  }

  build();
  legend();
  for (const pl of panels) {
    pl.canvas.addEventListener("mousemove", (ev) => hover(pl, ev));
    pl.canvas.addEventListener("mouseleave", () => { document.getElementById("tip").hidden = true; panels.forEach((p) => { p.hover = null; }); redraw(); });
  }
  window.addEventListener("resize", redraw);
  redraw();
})();
