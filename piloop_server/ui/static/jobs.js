// Jobs: a filtered list, and one job: its fields, its timeline of events, its log as it grows.
import { api, bytes, q } from "./api.js";
import { draw, el, stateCell, table, td, when } from "./dom.js";

const STATES = ["", "waiting", "queued", "leased", "running", "succeeded", "failed", "lost", "cancelled", "worker_lost", "expired"];
const ENDED = new Set(["succeeded", "failed", "lost", "cancelled", "worker_lost", "expired"]);

function cancelButton(id, after, said) {
  return el("button", {
    type: "button",
    class: "cancel",
    onclick: async () => {
      said.textContent = "";
      try {
        await api("POST", `/v1/jobs/${encodeURIComponent(id)}/cancel`);
        await after();
      } catch (e) {
        said.textContent = e.message;
      }
    },
  }, "cancel");
}

export function jobs() {
  const params = new URLSearchParams(location.search);
  const state = el("select", { name: "state" }, STATES.map((s) => el("option", { value: s }, s || "any state")));
  const pool = el("input", { name: "pool", placeholder: "pool", size: 10 });
  const campaign = el("input", { name: "campaign", placeholder: "campaign", size: 12 });
  state.value = params.get("state") || "";
  pool.value = params.get("pool") || "";
  campaign.value = params.get("campaign") || "";
  const said = el("span", { class: "error" });
  let list, refresh;
  const changed = () => {
    const s = q({ state: state.value, pool: pool.value.trim(), campaign: campaign.value.trim() });
    history.replaceState(null, "", s ? `?${s}` : location.pathname);
    refresh().catch((e) => (said.textContent = e.message));
  };
  for (const i of [state, pool, campaign]) i.addEventListener("change", changed);
  return {
    mount(main) {
      list = el("div", { id: "jobs" });
      main.append(el("h2", {}, "Jobs"), el("form", { class: "inline", onsubmit: (e) => (e.preventDefault(), changed()) }, state, pool, campaign, said), list);
    },
    refresh: (refresh = async () => {
      const c = campaign.value.trim();
      const got = await api("GET", `/v1/jobs?${q({ state: state.value, pool: pool.value.trim(), limit: c ? 1000 : 200 })}`);
      const rows = got.filter((j) => !c || j.campaign === c).slice(0, 200);
      draw(list, rows, () =>
        table(
          ["job", "kind", "pool", "campaign", "state", "worker", "attempts", "updated", "reason", ""],
          rows.map((j) => [
            el("a", { href: `/ui/jobs/${encodeURIComponent(j.id)}`, class: "mono" }, j.id),
            j.kind, j.pool, j.campaign, stateCell(j.state), j.worker, td({ class: "num" }, j.attempts),
            when(j.updated_ms), j.reason,
            ENDED.has(j.state) ? "" : cancelButton(j.id, refresh, said),
          ]),
          (i) => ({ "data-job": rows[i].id }),
        ),
      );
    }),
  };
}

function describe(e) {
  const skip = new Set(["id", "type", "by", "job", "token"]);
  return Object.entries(e).filter(([k]) => !skip.has(k)).map(([k, v]) => `${k}=${v}`).join(" ");
}

export function job(id) {
  const path = `/v1/jobs/${encodeURIComponent(id)}`;
  const said = el("span", { class: "error" });
  const decoder = new TextDecoder();
  let fields, timeline, log, actions, refresh;
  let chunks = 0; // log chunks shown
  let cursor = null; // the last event read
  const seen = [];
  return {
    mount(main) {
      fields = el("dl", { class: "fields", id: "job-fields" });
      actions = el("div", { class: "inline" }, cancelButton(id, () => refresh(), said));
      timeline = el("div", { id: "timeline" });
      log = el("pre", { class: "log", id: "log" });
      main.append(el("h2", {}, "Job ", el("span", { class: "mono" }, id)), fields, actions, said,
        el("h3", {}, "Timeline"), timeline, el("h3", {}, "Log"), log);
    },
    refresh: (refresh = async () => {
      const j = await api("GET", path);
      const result = Object.entries(j.result || {}).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
      const rows = [
        ["state", stateCell(j.state)], ["kind", j.kind], ["pool", j.pool], ["campaign", j.campaign || "-"],
        ["worker", j.worker || "-"], ["attempts", j.attempts], ["created", when(j.created_ms)],
        ["updated", when(j.updated_ms)], ["reason", j.reason || "-"], ["waiting", j.waiting || "-"],
        ["command", (j.spec.argv || []).join(" ")], ["result", result || "-"],
      ];
      fields.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { id: `job-${k}` }, v instanceof Node ? v.textContent : v)]));
      actions.hidden = ENDED.has(j.state);
      // the log: each chunk once, in order, as the worker uploads it
      while (chunks < j.log.length) {
        log.append(decoder.decode(await bytes(`${path}/log/${chunks}`), { stream: true }));
        chunks += 1;
      }
      const got = await api("GET", cursor ? `/v1/events?${q({ after: cursor, count: 1000 })}` : "/v1/events?last=10000");
      if (got.length) cursor = got[got.length - 1].id;
      seen.push(...got.filter((e) => e.job === id));
      timeline.replaceChildren(
        table(["when", "event", "by", ""], seen.map((e) => [when(Number(e.id.split("-")[0])), e.type, e.by, td({ class: "mono" }, describe(e))])),
      );
    }),
  };
}
