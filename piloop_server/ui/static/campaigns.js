// Campaigns: the list, and one campaign's runs ranked by score with a plot of score against time.
import { api } from "./api.js";
import { el, stateCell, table, td, when } from "./dom.js";
import { scorePlot } from "./plot.js";

const score = (s) => (s === null || s === undefined ? "-" : String(s));

export function campaigns() {
  let list;
  return {
    mount(main) {
      list = el("div", { id: "campaigns" });
      main.append(el("h2", {}, "Campaigns"), list);
    },
    async refresh() {
      const cs = await api("GET", "/v1/campaigns");
      list.replaceChildren(
        table(
          ["campaign", "state", "live agents", "queued", "target", "best score"],
          cs.map((c) => [
            el("a", { href: `/ui/campaigns/${encodeURIComponent(c.name)}` }, c.name), c.state,
            td({ class: "num" }, c.live), td({ class: "num" }, c.queued), td({ class: "num" }, c.agents),
            td({ class: "num best" }, score(c.best)),
          ]),
          (i) => ({ "data-campaign": cs[i].name }),
        ),
      );
    },
  };
}

export function campaign(name) {
  let head, plot, runs;
  return {
    mount(main) {
      head = el("dl", { class: "fields" });
      plot = el("div", { id: "plot" });
      runs = el("div", { id: "runs" });
      main.append(el("h2", {}, "Campaign ", name), head, el("h3", {}, "Score against time"), plot, el("h3", {}, "Runs, best first"), runs);
    },
    async refresh() {
      const c = await api("GET", `/v1/campaigns/${encodeURIComponent(name)}`);
      const rows = [
        ["state", c.state], ["best score", score(c.best)], ["agents", `${c.live} live, ${c.queued} queued, target ${c.agents}`],
        ["pools", `agents on ${c.agent_pool}, evaluations on ${c.eval_pool}`], ["agent command", c.agent_cmd],
        ["evaluation command", c.eval_cmd], ["created", `${when(c.created_ms)} by ${c.by}`],
      ];
      head.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { id: k === "best score" ? "best" : null }, v)]));
      const scored = c.runs.filter((r) => r.score !== null && r.score !== undefined);
      plot.replaceChildren(scorePlot(scored.map((r) => ({ t: r.created_ms, score: r.score, label: r.branch }))));
      runs.replaceChildren(
        table(
          ["#", "score", "branch", "run", "state", "evaluation", "worker", "started"],
          c.runs.map((r, i) => [
            td({ class: "num" }, r.score === null || r.score === undefined ? "" : i + 1), td({ class: "num score" }, score(r.score)),
            td({ class: "mono" }, r.branch), el("a", { href: `/ui/jobs/${encodeURIComponent(r.job)}`, class: "mono" }, r.job),
            stateCell(r.state), r.evaluation_state || "-", r.worker || "-", when(r.created_ms),
          ]),
          (i) => ({ "data-run": c.runs[i].job }),
        ),
      );
    },
  };
}
