// The page: one view by its path, drawn from the /v1 routes and drawn again every POLL_MS.
import { api, POLL_MS } from "./api.js";
import { overview } from "./overview.js";
import { jobs, job } from "./jobs.js";
import { campaigns, campaign } from "./campaigns.js";
import { events, inbox } from "./events.js";

const [, , view = "", name = ""] = location.pathname.split("/").map(decodeURIComponent);
const views = { "": overview, jobs, campaigns, events, inbox };
const v = name ? (view === "jobs" ? job(name) : campaign(name)) : views[view]();

for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === view);
document.getElementById("logout").addEventListener("click", async () => {
  await api("POST", "/ui/logout").catch(() => {});
  location.assign("/ui/login");
});

const main = document.getElementById("main");
const updated = document.getElementById("updated");
v.mount(main);
window.piloopRefresh = () => tick(false);

async function tick(again = true) {
  try {
    await v.refresh();
    updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
    updated.className = "";
  } catch (e) {
    updated.textContent = String(e.message || e);
    updated.className = "error";
  }
  if (again) setTimeout(tick, POLL_MS);
}
tick();
