// The same JSON routes the CLI reads. Writes carry the session's CSRF value, read from its cookie.

export const POLL_MS = 1500;

function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === name) return v.join("=");
  }
  return "";
}

export class ApiError extends Error {}

async function call(method, path, body) {
  const headers = {};
  if (method !== "GET") headers["x-piloop-csrf"] = cookie("piloop_csrf");
  const opts = { method, headers, credentials: "same-origin" };
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  if (r.status === 401) {
    location.assign("/ui/login");
    throw new ApiError("the session ended");
  }
  return r;
}

export async function api(method, path, body) {
  const r = await call(method, path, body);
  const json = (r.headers.get("content-type") || "").includes("json");
  const data = json ? await r.json() : await r.text();
  if (!r.ok) throw new ApiError((json && data.message) || `${method} ${path}: ${r.status}`);
  return data;
}

export async function bytes(path) {
  const r = await call("GET", path);
  if (!r.ok) throw new ApiError(`GET ${path}: ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

export function q(params) {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== null && v !== undefined) s.set(k, v);
  return s.toString();
}
