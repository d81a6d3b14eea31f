// Shared by the scripts of TestJSSDK: the connection to the server named
// by the environment, and a record of what each script checked.
//
//   OSB_DOMAIN         the server's host:port (no scheme)
//   OSB_API_KEY        its API key
//   OSB_IMAGE          the image of a plain sandbox
//   OSB_READY_SECONDS  how long the SDK may wait for a sandbox to be ready
//
// A script records each mismatch with check or eq and ends with report,
// which prints one JSON line: {ids, failures, notes, error}. The Go test
// fails on every entry of failures and on error.
import { ConnectionConfig, Sandbox } from "@alibaba-group/opensandbox";

export const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

export function connection(extra = {}) {
  return new ConnectionConfig({
    domain: env("OSB_DOMAIN"),
    apiKey: env("OSB_API_KEY"),
    requestTimeoutSeconds: 120,
    ...extra,
  });
}

export const readySeconds = () => Number(env("OSB_READY_SECONDS"));

const summary = { ids: [], failures: [], notes: [] };

function fail(name, detail) {
  summary.failures.push(`${name}: ${detail}`);
}

export function check(name, ok, detail = "") {
  if (!ok) fail(name, detail || "check failed");
  return ok;
}

// canonical is JSON with object keys sorted, so that eq does not depend
// on the order in which the server wrote them.
function canonical(v) {
  return JSON.stringify(v, (_, x) =>
    x && typeof x === "object" && !Array.isArray(x) && !(x instanceof Date)
      ? Object.fromEntries(Object.keys(x).sort().map((k) => [k, x[k]]))
      : x);
}

export function eq(name, got, want) {
  const g = canonical(got);
  const w = canonical(want);
  if (g !== w) fail(name, `got ${g}, want ${w}`);
  return g === w;
}

export function note(text) {
  summary.notes.push(text);
}

// step runs fn and records a thrown error as a failure of name, so that
// one broken call does not hide the checks after it.
export async function step(name, fn) {
  try {
    return await fn();
  } catch (err) {
    fail(name, describe(err));
    return undefined;
  }
}

// statusOf runs fn, which must fail, and returns the HTTP status of its
// error (0 if it succeeded or failed without one).
export async function statusOf(fn) {
  try {
    await fn();
    return 0;
  } catch (err) {
    return err?.statusCode ?? err?.status ?? -1;
  }
}

export function describe(err) {
  let s = String(err?.stack ?? err);
  if (err?.statusCode) s += ` (HTTP ${err.statusCode})`;
  if (err?.error?.code) s += ` [${err.error.code}: ${err.error.message}]`;
  return s;
}

// create makes a sandbox through Sandbox.create and remembers its id, so
// that the Go test waits for it to be gone.
export async function create(opts) {
  const sbx = await Sandbox.create({
    connectionConfig: connection(),
    readyTimeoutSeconds: readySeconds(),
    timeoutSeconds: 900,
    ...opts,
  });
  summary.ids.push(sbx.id);
  return sbx;
}

// main runs body, kills the sandboxes it made, and prints the summary.
export async function main(body) {
  const made = [];
  try {
    await body(made);
  } catch (err) {
    summary.error = describe(err);
  } finally {
    for (const sbx of made) {
      try {
        await sbx.kill();
      } catch (err) {
        summary.failures.push(`kill ${sbx.id}: ${describe(err)}`);
      }
      await sbx.close();
    }
  }
  console.log(JSON.stringify(summary));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
