// Drives `osb mcp` over stdio with the official MCP TypeScript SDK, as an
// agent's client does, and checks what a model reads: schemas without
// null unions and with the server's limits, output cut at line
// boundaries, binary output described, listings paged within the output
// budget, prose with relative expiry. Prints one JSON line: the checks
// that failed, and facts for the Go test.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const failures = [];
const facts = { called: [] };
const check = (ok, what) => { if (!ok) failures.push(what); };

const transport = new StdioClientTransport({
  command: process.env.OSB_BIN,
  args: ["mcp", "--image", process.env.OSB_IMAGE],
  env: { ...process.env },
  stderr: "inherit",
});
const client = new Client({ name: "e2e-mcp-js", version: "1" });
await client.connect(transport);

const textOf = (res) => (res.content || []).filter((c) => c.type === "text").map((c) => c.text).join("");
// toolError: whether the call must fail as a tool error; null: either.
async function call(name, args, { toolError = false } = {}) {
  facts.called.push(name);
  const res = await client.callTool({ name, arguments: args });
  const text = textOf(res);
  if (toolError !== null && !!res.isError !== toolError) failures.push(`${name}(${JSON.stringify(args)}): isError ${!!res.isError}: ${text.slice(0, 300)}`);
  return { res, text, out: res.structuredContent || {} };
}

try {
  // Schemas.
  const { tools } = await client.listTools();
  facts.tools = tools.length;
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  for (const t of tools) {
    for (const [which, sc] of [["input", t.inputSchema], ["output", t.outputSchema]]) {
      const s = JSON.stringify(sc || {});
      check(!s.includes('"type":[') && !s.includes('"null"'), `${t.name}: ${which} schema has a type union`);
    }
    const mo = t.inputSchema.properties?.max_output_chars;
    check(mo && mo.type === "integer" && mo.maximum >= mo.minimum && mo.default === 20000, `${t.name}: max_output_chars ${JSON.stringify(mo)}`);
  }
  for (const n of ["sandbox_pause", "sandbox_resume", "sandbox_renew"]) {
    check(byName[n]?.annotations?.destructiveHint === false, `${n}: destructiveHint ${byName[n]?.annotations?.destructiveHint}`);
  }
  const ct = byName.sandbox_create.inputSchema.properties.timeout_seconds;
  facts.createTimeout = { minimum: ct.minimum, maximum: ct.maximum };
  facts.renewTimeout = { minimum: byName.sandbox_renew.inputSchema.properties.timeout_seconds.minimum, maximum: byName.sandbox_renew.inputSchema.properties.timeout_seconds.maximum };

  // Sandboxes, in prose.
  const created = await call("sandbox_create", { timeout_seconds: 600, metadata: { suite: "mcp-js" } });
  const id = created.out.sandbox_id;
  facts.createText = created.text;
  check(/^created sandbox \S+: Running, image .*expires in (9m5\d|10m0)s/.test(created.text), `sandbox_create text: ${created.text}`);
  check(!created.text.trim().startsWith("{"), "sandbox_create answers JSON as text");
  const got = await call("sandbox_get", { sandbox_id: id });
  check(got.text.includes(`sandbox ${id}: Running`) && got.text.includes("expires in"), `sandbox_get text: ${got.text}`);
  const listed = await call("sandbox_list", { metadata: { suite: "mcp-js" } });
  check(listed.text.includes(id) && /page 1: 1 of 1 sandboxes/.test(listed.text), `sandbox_list text: ${listed.text}`);
  const renewed = await call("sandbox_renew", { sandbox_id: id, timeout_seconds: 1200 });
  check(/expires in (19m5\d|20m0)s/.test(renewed.text), `sandbox_renew text: ${renewed.text}`);
  const ep = await call("sandbox_endpoint", { sandbox_id: id, port: 8080 });
  check(ep.text.startsWith("port 8080 of sandbox") && ep.out.url, `sandbox_endpoint: ${ep.text}`);
  // This server has no ingress gateway: sandbox_url says so and points to sandbox_endpoint.
  const link = await call("sandbox_url", { sandbox_id: id, port: 8080 }, { toolError: true });
  check(link.text.includes("sandbox_endpoint") && link.text.includes("gateway"), `sandbox_url without a gateway: ${link.text}`);
  const paused = await call("sandbox_pause", { sandbox_id: id });
  check(paused.text.startsWith(`paused: sandbox ${id}: Paused`), `sandbox_pause text: ${paused.text}`);
  const resumed = await call("sandbox_resume", { sandbox_id: id });
  check(resumed.text.startsWith(`resumed: sandbox ${id}: Running`), `sandbox_resume text: ${resumed.text}`);

  // Truncation at line boundaries: seq leaves no fragment of a number.
  const seq = await call("command_run", { sandbox_id: id, command: "seq 1 100000", max_output_chars: 1000 });
  const m = seq.text.match(/--- stdout \(truncated[^\n]*---\n([\s\S]*?)\[\.\.\. (\d+) lines \((\d+) bytes\) omitted \.\.\.\]\n([\s\S]*)$/);
  check(m, `command_run seq: no line note in ${seq.text.slice(0, 200)}...`);
  if (m) {
    const head = m[1].trimEnd().split("\n").map(Number), tail = m[4].trimEnd().split("\n").map(Number);
    const headOK = head.every((n, i) => n === i + 1), tailOK = tail.every((n, i) => n === 100000 - tail.length + 1 + i);
    check(headOK && tailOK, `seq head/tail are not whole lines: ${head.slice(-3)} / ${tail.slice(0, 3)}`);
    check(Number(m[2]) === 100000 - head.length - tail.length, `seq: ${m[2]} lines omitted, want ${100000 - head.length - tail.length}`);
    facts.seq = { head: head.length, tail: tail.length, omittedLines: Number(m[2]), omittedBytes: Number(m[3]) };
  }
  check(seq.out.stdout_truncated === true, "seq: stdout_truncated not set");

  // Binary stdout.
  for (const command of ["head -c 3000 /dev/urandom", "printf 'ELF\\000\\001'"]) {
    const bin = await call("command_run", { sandbox_id: id, command });
    check(bin.out.stdout_binary === true && bin.text.includes("[binary output: not shown") && !bin.text.includes("\uFFFD"), `binary (${command}): ${bin.text}`);
  }

  // Background commands.
  const started = await call("command_start", { sandbox_id: id, command: "seq 1 50000" });
  const logs = await call("command_logs", { sandbox_id: id, command_id: started.out.command_id, wait_seconds: 30, max_output_chars: 500 });
  check(/\[\.\.\. \d+ lines \(\d+ bytes\) omitted \.\.\.\]\n/.test(logs.text) && /\n50000\n?$/.test(logs.text) && logs.text.includes("exit code 0"), `command_logs: ${logs.text}`);
  const sleeper = await call("command_start", { sandbox_id: id, command: "sleep 300" });
  await call("command_stop", { sandbox_id: id, command_id: sleeper.out.command_id });

  // Files: a directory of 1500 entries in pages within the budget.
  await call("command_run", { sandbox_id: id, command: "mkdir -p /tmp/many && cd /tmp/many && i=1; while [ $i -le 1500 ]; do : > file-$i.txt; i=$((i+1)); done" });
  for (const [tool, args] of [["file_list", { path: "/tmp/many" }], ["file_search", { path: "/tmp", pattern: "file-*.txt" }]]) {
    let offset = 0, seen = 0, pages = 0, more = true;
    while (more && pages < 50) {
      const page = await call(tool, { sandbox_id: id, ...args, offset, max_output_chars: 5000 });
      pages++;
      check(page.text.length <= 5000, `${tool}: a page of ${page.text.length} characters for a budget of 5000`);
      check(page.out.total === 1500 && page.out.entries.length > 0, `${tool}: page ${JSON.stringify({ total: page.out.total, n: page.out.entries?.length })}`);
      const lines = page.text.split("\n").filter((l) => l.includes("/tmp/many/"));
      check(lines.length === page.out.entries.length, `${tool}: ${lines.length} lines of text, ${page.out.entries.length} structured entries`);
      seen += page.out.entries.length;
      more = page.out.truncated === true;
      if (more) {
        check(page.text.endsWith(`more: call ${tool} with offset ${page.out.next_offset}]`), `${tool}: page ends ${page.text.slice(-100)}`);
        offset = page.out.next_offset;
      }
    }
    check(seen === 1500 && pages > 1, `${tool}: ${seen} entries in ${pages} pages`);
    facts[tool + "Pages"] = pages;
  }
  await call("file_write", { sandbox_id: id, path: "/tmp/notes/a.txt", content: "one\ntwo\n" });
  const read = await call("file_read", { sandbox_id: id, path: "/tmp/notes/a.txt" });
  check(read.text.includes("one\ntwo"), `file_read: ${read.text}`);
  await call("file_move", { sandbox_id: id, source: "/tmp/notes/a.txt", destination: "/tmp/notes/b.txt" });
  await call("file_delete", { sandbox_id: id, path: "/tmp/notes", recursive: true });

  // The other tools answer as tool results with text for the model
  // (errors where the sandbox has no interpreter, policy or vault).
  const others = [
    ["pool_list", {}], ["pool_get", { pool: "no-such-pool" }],
    ["code_context_list", { sandbox_id: id }], ["code_context_create", { sandbox_id: id, language: "python" }],
    ["code_context_delete", { sandbox_id: id, context_id: "nope" }], ["code_run", { sandbox_id: id, code: "1+1" }],
    ["egress_get", { sandbox_id: id }], ["egress_allow", { sandbox_id: id, targets: ["example.com"] }],
    ["egress_deny", { sandbox_id: id, targets: ["example.com"] }], ["egress_remove", { sandbox_id: id, targets: ["example.com"] }],
    ["vault_get", { sandbox_id: id }], ["vault_attach", { sandbox_id: id, credential: "none", hosts: ["api.example.com"] }],
    ["vault_detach", { sandbox_id: id, binding: "none" }],
  ];
  for (const [n, args] of others) {
    const r = await call(n, args, { toolError: null });
    check(r.text.trim() !== "", `${n}: no text`);
  }

  const killed = await call("sandbox_kill", { sandbox_id: id });
  check(killed.text === `sandbox ${id} killed`, `sandbox_kill: ${killed.text}`);
} catch (e) {
  failures.push(`exception: ${e.stack || e}`);
} finally {
  await client.close();
}
facts.called = [...new Set(facts.called)].sort();
console.log(JSON.stringify({ failures, ...facts }));
