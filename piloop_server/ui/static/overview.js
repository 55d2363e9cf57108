// Overview: each pool's slots, queue and why its next job waits; each worker; the limits, and setting them.
import { api } from "./api.js";
import { ago, draw, el, section, table, td } from "./dom.js";

function workerState(w) {
  if (!w.reachable) return w.no_lease === "starting" || w.no_lease === "stopping" ? w.no_lease : "unreachable";
  return w.draining ? "draining" : "ready";
}

// why the pool's queued jobs have no lease: the server's words (`piloop status`, `job show`)
function waits(p) {
  const queued = p.agent_queued + p.evaluation_queued;
  if (!queued) return "nothing waits";
  const why = Object.entries(p.waiting || {}).map(([kind, text]) => `${kind}s wait: ${text}`);
  return why.length ? why.join("; ") : "a free slot: the next claim takes it";
}

function slots(p, kind) {
  const total = p[`${kind}_slots`];
  return `${total - p[`${kind}_free`]} / ${total} (${p[`${kind}_free`]} free)`;
}

function parseValue(text) {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

export function overview() {
  let pools, workers, provisioned, limits, refresh;
  const key = el("input", { name: "key", placeholder: "executor.pools.gpu.evaluations", size: 34 });
  const value = el("input", { name: "value", placeholder: "value", size: 8 });
  const reason = el("input", { name: "reason", placeholder: "reason", size: 24 });
  const said = el("span", { class: "error" });
  const setLimit = async (ev) => {
    ev.preventDefault();
    said.textContent = "";
    try {
      await api("POST", "/v1/limits", { key: key.value.trim(), value: parseValue(value.value.trim()), reason: reason.value.trim() });
      await refresh();
    } catch (e) {
      said.textContent = e.message;
    }
  };
  const act = (fn) => async () => {
    said.textContent = "";
    try {
      await fn();
      await refresh();
    } catch (e) {
      said.textContent = e.message;
    }
  };
  return {
    mount(main) {
      const [ph, pd] = section("Pools", "pools");
      const [wh, wd] = section("Workers", "workers");
      const [vh, vd] = section("Provisioned pools", "provisioned");
      const [lh, ld] = section("Limits", "limits");
      [pools, workers, provisioned, limits] = [pd, wd, vd, ld];
      const form = el("form", { class: "inline", id: "limit-form", onsubmit: setLimit }, key, value, reason, el("button", { type: "submit" }, "set limit"), said);
      main.append(ph, pd, wh, wd, vh, vd, lh, ld, form);
    },
    refresh: (refresh = async () => {
      const [st, ws, ls] = await Promise.all([api("GET", "/v1/status"), api("GET", "/v1/workers"), api("GET", "/v1/limits")]);
      pools.replaceChildren(
        table(
          ["pool", "workers", "agent slots", "evaluation slots", "queued (agents / evaluations)", "running", "next job"],
          st.pools.map((p) => [
            p.pool,
            `${p.reachable} / ${p.workers} reachable`,
            slots(p, "agent"),
            slots(p, "evaluation"),
            `${p.agent_queued} / ${p.evaluation_queued}`,
            `${p.agent_running + p.evaluation_running}`,
            td({ class: "waits" }, waits(p)),
          ]),
          (i) => ({ "data-pool": st.pools[i].pool }),
        ),
      );
      workers.replaceChildren(
        table(
          ["worker", "pool", "state", "host", "heartbeat", "leases", "no lease"],
          ws.map((w) => [
            td({ class: "name" }, w.name),
            w.pool,
            td({ class: "state" }, workerState(w)),
            w.host + (w.sample ? ` · load ${w.sample.load1.toFixed(1)}/${w.sample.cpus} · ${w.sample.memory_available_gb.toFixed(1)} GB free` : ""),
            ago(w.seen_seconds),
            `${w.agents} agent(s), ${w.evaluations} evaluation(s)`,
            w.no_lease,
          ]),
          (i) => ({ "data-worker": ws[i].name }),
        ),
      );
      draw(provisioned, st.provisioners, () =>
        table(
          ["pool", "provider", "max", "starting", "running", "draining", ""],
          st.provisioners.map((p) => [
            p.pool, p.provider, p.max, p.starting, p.running, p.draining,
            el("button", {
              type: "button",
              onclick: act(() => api("POST", "/v1/limits", { key: `executor.pools.${p.pool}.provisioner.max`, value: 0, reason: "drained from the page" })),
            }, "drain"),
          ]),
        ),
      );
      draw(limits, ls, () =>
        table(
          ["key", "value", "reason", "by", ""],
          ls.map((l) => [
            td({ class: "mono" }, l.key), JSON.stringify(l.value), l.reason, l.by,
            el("button", { type: "button", onclick: act(() => api("DELETE", `/v1/limits/${encodeURIComponent(l.key)}`)) }, "unset"),
          ]),
        ),
      );
    }),
  };
}
