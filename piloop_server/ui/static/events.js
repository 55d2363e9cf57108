// The event stream as it comes, newest first; and the inbox of escalations, each acknowledged from here.
import { api, q } from "./api.js";
import { draw, el, table, td, when } from "./dom.js";

const KEEP = 500;

export function events() {
  let list;
  let cursor = null;
  let kept = [];
  return {
    mount(main) {
      list = el("div", { id: "events" });
      main.append(el("h2", {}, "Events"), list);
    },
    async refresh() {
      const got = await api("GET", cursor ? `/v1/events?${q({ after: cursor, count: 1000 })}` : `/v1/events?last=${KEEP}`);
      if (got.length) cursor = got[got.length - 1].id;
      kept = [...got.reverse(), ...kept].slice(0, KEEP);
      list.replaceChildren(
        table(
          ["when", "event", "by", "job", "fields"],
          kept.map((e) => {
            const rest = Object.entries(e).filter(([k]) => !["id", "type", "by", "job", "token"].includes(k));
            return [when(Number(e.id.split("-")[0])), e.type, e.by, td({ class: "mono" }, e.job || ""), td({ class: "mono" }, rest.map(([k, v]) => `${k}=${v}`).join(" "))];
          }),
          (i) => ({ "data-event": kept[i].id }),
        ),
      );
    },
  };
}

export function inbox() {
  let list, refresh;
  const said = el("span", { class: "error" });
  return {
    mount(main) {
      list = el("div", { id: "inbox" });
      main.append(el("h2", {}, "Inbox"), said, list);
    },
    refresh: (refresh = async () => {
      const items = await api("GET", "/v1/inbox");
      draw(list, items, () =>
        table(
          ["when", "what", "message", ""],
          items.map((x) => [
            when(x.at_ms), x.what, x.message,
            el("button", {
              type: "button",
              onclick: async () => {
                try {
                  await api("POST", `/v1/inbox/${encodeURIComponent(x.id)}/ack`);
                  await refresh();
                } catch (e) {
                  said.textContent = e.message;
                }
              },
            }, "acknowledge"),
          ]),
          (i) => ({ "data-escalation": items[i].id }),
        ),
      );
    }),
  };
}
