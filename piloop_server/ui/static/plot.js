// A campaign's scores against time as inline SVG: each scored run a dot, the best so far a step line.
const NS = "http://www.w3.org/2000/svg";
const W = 640, H = 240, PAD = { l: 48, r: 12, t: 12, b: 28 };

function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// points: [{t: ms, score: number, label: string}]
export function scorePlot(points) {
  const root = svg("svg", { class: "plot", id: "score-plot", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  if (!points.length) {
    root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no scored run yet"));
    return root;
  }
  const pts = [...points].sort((a, b) => a.t - b.t);
  const t0 = pts[0].t, t1 = Math.max(pts[pts.length - 1].t, t0 + 1000);
  let lo = Math.min(...pts.map((p) => p.score)), hi = Math.max(...pts.map((p) => p.score));
  if (lo === hi) [lo, hi] = [lo - 1, hi + 1];
  const x = (t) => PAD.l + ((t - t0) / (t1 - t0)) * (W - PAD.l - PAD.r);
  const y = (s) => H - PAD.b - ((s - lo) / (hi - lo)) * (H - PAD.t - PAD.b);
  root.append(
    svg("line", { class: "axis", x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b }),
    svg("line", { class: "axis", x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b }),
    svg("text", { x: PAD.l - 6, y: y(hi) + 4, "text-anchor": "end" }, String(+hi.toFixed(3))),
    svg("text", { x: PAD.l - 6, y: y(lo) + 4, "text-anchor": "end" }, String(+lo.toFixed(3))),
    svg("text", { x: PAD.l, y: H - 8 }, new Date(t0).toLocaleTimeString()),
    svg("text", { x: W - PAD.r, y: H - 8, "text-anchor": "end" }, new Date(t1).toLocaleTimeString()),
  );
  let best = -Infinity;
  const steps = [];
  for (const p of pts) {
    if (p.score > best) {
      if (steps.length) steps.push(`${x(p.t)},${y(best)}`);
      best = p.score;
      steps.push(`${x(p.t)},${y(best)}`);
    }
  }
  steps.push(`${x(t1)},${y(best)}`);
  root.append(svg("polyline", { class: "best", points: steps.join(" ") }));
  for (const p of pts) {
    const dot = svg("circle", { cx: x(p.t), cy: y(p.score), r: 3.5 });
    dot.append(svg("title", {}, `${p.label}: ${p.score}`));
    root.append(dot);
  }
  return root;
}
