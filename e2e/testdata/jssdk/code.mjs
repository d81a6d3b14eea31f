// Code contexts through the published SDK, in a code-interpreter sandbox.
//
//   OSB_CODE_IMAGE     the code-interpreter image
//   OSB_CODE_LANGS     the languages to drive, comma-separated
//
// This SDK (unlike the separate code-interpreter package, which this
// registry does not serve) has no code-context API, so contexts are
// driven as that package drives them: the SDK's own execd client (its
// "internal" entry point) for /code/context and /code/contexts, and fetch
// for the /code stream, both on the endpoint and headers the SDK resolved
// for execd.
import { createExecdClient } from "@alibaba-group/opensandbox/internal";
import { check, create, env, eq, main, sleep, step } from "./lib.mjs";

const langs = env("OSB_CODE_LANGS").split(",");

// What each language runs: set stores 42 in a variable, get reads it
// back as a result (or, for go, which has no expression values, as
// output), print writes to stdout, fail raises (errorName is a part of
// the error's name), loop runs until interrupted.
const programs = {
  python: {
    set: "x = 6 * 7", get: "x", print: "print('hello')",
    fail: "def f():\n    raise KeyError('k')\nf()", errorName: "KeyError",
    loop: "while True:\n    pass",
  },
  javascript: {
    set: "let x = 6 * 7", get: "x", print: "console.log('hello')",
    fail: "throw new TypeError('bad')", errorName: "TypeError", loop: "while (true) {}",
  },
  typescript: {
    set: "let x: number = 6 * 7", get: "x", print: "console.log('hello')",
    fail: "throw new TypeError('bad')", errorName: "TypeError", loop: "while (true) {}",
  },
  java: {
    set: "int x = 6 * 7;", get: "x", print: "System.out.println(\"hello\");",
    fail: "throw new IllegalStateException(\"bad\");", errorName: "IllegalStateException", loop: "while (true) {}",
  },
  go: {
    set: "import \"fmt\"\n\nvar x = 6 * 7", get: "fmt.Println(x)", getStdout: true, print: "fmt.Println(\"hello\")",
    fail: "fmt.Println(undefinedName)", errorName: "", loop: "for {\n}",
  },
};

let base;
let headers;
let execd;

// runCode posts to /code and returns the stream's events; onEvent sees
// each as it arrives.
async function runCode(context, code, onEvent) {
  const res = await fetch(`${base}/code`, {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/json", Accept: "text/event-stream" },
    body: JSON.stringify({ context, code }),
  });
  if (!res.ok) throw new Error(`POST /code: HTTP ${res.status}: ${await res.text()}`);
  const events = [];
  const decoder = new TextDecoder();
  let buf = "";
  const take = (line) => {
    line = line.trim();
    if (line.startsWith("data:")) line = line.slice(5).trim();
    if (!line || line.startsWith(":")) return;
    const ev = JSON.parse(line);
    events.push(ev);
    onEvent?.(ev);
  };
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      take(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  }
  take(buf);
  return events;
}

const stdout = (evs) => evs.filter((e) => e.type === "stdout").map((e) => e.text).join("");
const results = (evs) => evs.filter((e) => e.type === "result").map((e) => e.results?.["text/plain"] ?? e.results?.text);
const errorOf = (evs) => evs.find((e) => e.type === "error")?.error;

async function call(what, p) {
  const { data, error, response } = await p;
  if (!response.ok) throw new Error(`${what}: HTTP ${response.status}: ${JSON.stringify(error)}`);
  return data;
}

// context runs one language's checks in a context of its own.
async function context(lang) {
  const p = programs[lang];
  const ctx = await call(`${lang} context`, execd.POST("/code/context", { body: { language: lang } }));
  check(`${lang}: context id`, /^[0-9a-f]{32}$/.test(ctx?.id ?? ""), JSON.stringify(ctx));
  eq(`${lang}: context language`, ctx?.language, lang);
  const c = { id: ctx.id, language: lang };

  const set = await runCode(c, p.set);
  eq(`${lang}: set runs without error`, errorOf(set), undefined);
  eq(`${lang}: init carries the context id`, set[0]?.type === "init" ? set[0].text : set[0], ctx.id);
  const get = await runCode(c, p.get);
  if (p.getStdout) eq(`${lang}: state kept`, stdout(get), "42\n");
  else eq(`${lang}: state kept`, results(get), ["42"]);
  eq(`${lang}: stdout`, stdout(await runCode(c, p.print)), "hello\n");

  const failed = await runCode(c, p.fail);
  const err = errorOf(failed);
  check(`${lang}: error event`, !!err && err.ename.includes(p.errorName) && Array.isArray(err.traceback) && err.traceback.length > 0,
    JSON.stringify(err));
  check(`${lang}: state kept after an error`, JSON.stringify(p.getStdout ? stdout(await runCode(c, p.get)) : results(await runCode(c, p.get))) ===
    JSON.stringify(p.getStdout ? "42\n" : ["42"]), "lost");

  // Interrupt a run that never ends by itself.
  let started = false;
  const t0 = Date.now();
  const looping = runCode(c, p.loop, (ev) => { if (ev.type === "init") started = true; });
  for (const deadline = Date.now() + 10_000; !started && Date.now() < deadline;) await sleep(50);
  await sleep(500);
  await call(`${lang} interrupt`, execd.DELETE("/code", { params: { query: { id: ctx.id } } }));
  const stopped = await looping;
  check(`${lang}: interrupt ends the run with an error`, Date.now() - t0 < 20_000 && !!errorOf(stopped),
    `${Date.now() - t0} ms, events ${JSON.stringify(stopped.map((e) => e.type))}`);
  eq(`${lang}: usable after the interrupt`, stdout(await runCode(c, p.print)), "hello\n");

  const got = await call(`${lang} get context`, execd.GET("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } }));
  eq(`${lang}: get context`, [got?.id, got?.language], [ctx.id, lang]);
  const list = await call(`${lang} list`, execd.GET("/code/contexts", { params: { query: { language: lang } } }));
  check(`${lang}: listed`, list?.some((x) => x.id === ctx.id && x.language === lang), JSON.stringify(list));
  await call(`${lang} delete`, execd.DELETE("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } }));
  const { response } = await execd.GET("/code/contexts/{context_id}", { params: { path: { context_id: ctx.id } } });
  eq(`${lang}: get after delete`, response.status, 404);
}

await main(async (made) => {
  const sbx = await create({ image: env("OSB_CODE_IMAGE"), resource: { cpu: "2", memory: "2Gi" } });
  made.push(sbx);
  const ep = await sbx.getEndpoint(44772);
  base = await sbx.getEndpointUrl(44772);
  headers = ep.headers ?? {};
  execd = createExecdClient({ baseUrl: base, headers });

  // The default python context: no id, state shared between runs;
  // output streamed as it is printed.
  await step("python: default context", async () => {
    await runCode({ language: "python" }, "import time\ndefault_ctx = 'kept'");
    eq("python: default context state", results(await runCode({ language: "python" }, "default_ctx")), ["'kept'"]);
    const arrivals = [];
    const t0 = Date.now();
    await runCode({ language: "python" }, "for i in range(3):\n    print(i, flush=True)\n    time.sleep(0.4)",
      (ev) => { if (ev.type === "stdout") arrivals.push(Date.now() - t0); });
    const total = Date.now() - t0;
    check("python: output streamed", arrivals.length > 0 && arrivals[0] < total - 600, `arrivals ${arrivals} of ${total} ms`);
  });

  // Every language at once, each in its own context, in one sandbox.
  await Promise.all(langs.map((lang) => step(`${lang}:`, () => context(lang))));
});
