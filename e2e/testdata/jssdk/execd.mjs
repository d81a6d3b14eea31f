// What a user does inside a sandbox through the published SDK: commands
// (output, exit codes, streaming, working directory and env, background
// commands with their status and logs, interrupt), bash sessions, and
// files (write, read, line reads, ranges, info, list, search, replace,
// permissions, move, delete, streamed upload and download).
import { createHash, randomBytes } from "node:crypto";
import { check, create, eq, env, main, statusOf, step, sleep } from "./lib.mjs";

// Command output comes one event per line, terminator stripped (the
// protocol's framing); a session's stdout and stderr come merged.
const lines = (msgs) => msgs.map((m) => m.text);

await main(async (made) => {
  const sbx = await create({ image: env("OSB_IMAGE"), entrypoint: ["sleep", "infinity"] });
  made.push(sbx);
  await commands(sbx);
  await sessions(sbx);
  await files(sbx);
});

async function commands(sbx) {
  await step("run", async () => {
    const ex = await sbx.commands.run("echo out; echo err >&2; exit 3");
    eq("run stdout", lines(ex.logs.stdout), ["out"]);
    eq("run stderr", lines(ex.logs.stderr), ["err"]);
    eq("run exit code", ex.exitCode, 3);
    check("run carries an id", typeof ex.id === "string" && ex.id !== "", JSON.stringify(ex.id));
    eq("run error name", ex.error?.name, "CommandExecError");
    const ok = await sbx.commands.run("pwd; echo $A", { workingDirectory: "/tmp", envs: { A: "b" } });
    eq("run in a directory with env", [lines(ok.logs.stdout), ok.exitCode, ok.error], [["/tmp", "b"], 0, undefined]);
    check("run completes", ok.complete?.executionTimeMs >= 0, JSON.stringify(ok.complete));
  });

  // Output arrives while the command runs, not at its end.
  await step("streamed output", async () => {
    const seen = [];
    const started = Date.now();
    const ex = await sbx.commands.run("for i in 1 2 3; do echo line$i; sleep 0.4; done", {}, {
      onStdout: (m) => seen.push([m.text, Date.now() - started]),
    });
    eq("streamed lines", seen.map(([t]) => t), ["line1", "line2", "line3"]);
    const first = seen[0]?.[1] ?? Infinity;
    const total = Date.now() - started;
    check("first line arrives before the end", first < total - 600, `first after ${first} ms of ${total} ms`);
    eq("streamed exit code", ex.exitCode, 0);
  });

  await step("timeout", async () => {
    const started = Date.now();
    const ex = await sbx.commands.run("sleep 30", { timeoutSeconds: 1 });
    check("timeoutSeconds ends the command", Date.now() - started < 10_000 && ex.exitCode !== 0,
      `${Date.now() - started} ms, exit ${ex.exitCode}, error ${JSON.stringify(ex.error)}`);
  });

  await step("background", async () => {
    const ex = await sbx.commands.run("echo bg-start; sleep 1; echo bg-done >&2; exit 4", { background: true });
    check("background answers an id at once", typeof ex.id === "string" && ex.id !== "", JSON.stringify(ex));
    const first = await sbx.commands.getCommandStatus(ex.id);
    eq("background status while running", [first.id, first.running, first.exitCode], [ex.id, true, null]);
    check("background startedAt", first.startedAt instanceof Date, String(first.startedAt));
    let st = first;
    for (const deadline = Date.now() + 20_000; st.running && Date.now() < deadline; await sleep(200)) {
      st = await sbx.commands.getCommandStatus(ex.id);
    }
    eq("background status when done", [st.running, st.exitCode], [false, 4]);
    check("background finishedAt", st.finishedAt instanceof Date && st.finishedAt >= st.startedAt, String(st.finishedAt));
    const logs = await sbx.commands.getBackgroundCommandLogs(ex.id);
    eq("background logs", logs.content, "bg-start\nbg-done\n");
    check("background logs cursor", typeof logs.cursor === "number" && logs.cursor > 0, JSON.stringify(logs.cursor));
    const tail = await sbx.commands.getBackgroundCommandLogs(ex.id, logs.cursor);
    eq("background logs after the cursor", tail.content, "");
    eq("status of an unknown command", await statusOf(() => sbx.commands.getCommandStatus("no-such-command")), 404);
  });

  // Interrupt a foreground command with the id its init event carried.
  await step("interrupt", async () => {
    let id;
    const started = Date.now();
    const running = sbx.commands.run("echo ready; sleep 60", {}, {
      onInit: (init) => { id = init.id; },
    });
    for (const deadline = Date.now() + 10_000; !id && Date.now() < deadline;) await sleep(50);
    check("init event carries the id", !!id, "no init event");
    await sleep(300);
    await sbx.commands.interrupt(id);
    const ex = await running;
    const took = Date.now() - started;
    check("interrupt ends the command", took < 20_000 && ex.exitCode !== 0, `${took} ms, exit ${ex.exitCode}`);
    eq("output before the interrupt", lines(ex.logs.stdout), ["ready"]);
  });
}

async function sessions(sbx) {
  await step("sessions", async () => {
    const id = await sbx.commands.createSession({ workingDirectory: "/tmp" });
    check("createSession answers an id", typeof id === "string" && id !== "", JSON.stringify(id));
    const first = await sbx.commands.runInSession(id, "pwd; cd /etc; export SESSION_VAR=kept");
    eq("session first run", [lines(first.logs.stdout), first.exitCode], [["/tmp"], 0]);
    const second = await sbx.commands.runInSession(id, "pwd; echo $SESSION_VAR");
    eq("session keeps cwd and variables", lines(second.logs.stdout), ["/etc", "kept"]);
    const failed = await sbx.commands.runInSession(id, "echo oops >&2; false");
    eq("session failing run", [lines(failed.logs.stdout), failed.exitCode], [["oops"], 1]);
    const wd = await sbx.commands.runInSession(id, "pwd", { workingDirectory: "/bin" });
    eq("session run with its own directory", lines(wd.logs.stdout), ["/bin"]);
    const other = await sbx.commands.createSession();
    const fresh = await sbx.commands.runInSession(other, "echo [$SESSION_VAR]");
    eq("sessions are separate", lines(fresh.logs.stdout), ["[]"]);
    await sbx.commands.deleteSession(id);
    await sbx.commands.deleteSession(other);
    eq("run in a deleted session", await statusOf(() => sbx.commands.runInSession(id, "true")), 500);
  });
}

async function files(sbx) {
  const f = sbx.files;
  const numbered = Array.from({ length: 10 }, (_, i) => `line ${i + 1}`).join("\n") + "\n";
  const bin = randomBytes(4096);
  await step("write and read", async () => {
    await f.createDirectories([{ path: "/tmp/js/sub", mode: 755 }]);
    await f.writeFiles([
      { path: "/tmp/js/lines.txt", data: numbered, mode: 640 },
      { path: "/tmp/js/sub/data.bin", data: bin },
      { path: "/tmp/js/sub/notes.md", data: "# notes\nalpha beta alpha\n" },
    ]);
    eq("readFile", await f.readFile("/tmp/js/lines.txt"), numbered);
    eq("readBytes", Buffer.from(await f.readBytes("/tmp/js/sub/data.bin")).equals(bin), true);
    eq("read a missing file", await statusOf(() => f.readFile("/tmp/js/missing")), 404);
  });

  // Line reads: offset is the first line (1-based), limit how many.
  await step("line reads", async () => {
    eq("readFile offset 3 limit 2", await f.readFile("/tmp/js/lines.txt", { offset: 3, limit: 2 }), "line 3\nline 4\n");
    eq("readFile offset 9 limit 5", await f.readFile("/tmp/js/lines.txt", { offset: 9, limit: 5 }), "line 9\nline 10\n");
    eq("readFile with a range", await f.readFile("/tmp/js/lines.txt", { range: "bytes=0-5" }), "line 1");
    eq("line read with a range", await statusOf(() => f.readFile("/tmp/js/lines.txt", { offset: 1, limit: 1, range: "bytes=0-5" })), 400);
  });

  await step("info, list, search", async () => {
    const info = await f.getFileInfo(["/tmp/js/lines.txt", "/tmp/js/sub"]);
    const li = info["/tmp/js/lines.txt"];
    eq("getFileInfo file", [li?.path, li?.type, li?.size, li?.mode], ["/tmp/js/lines.txt", "file", numbered.length, 640]);
    check("getFileInfo modifiedAt", li?.modifiedAt instanceof Date && Math.abs(li.modifiedAt - Date.now()) < 600_000, String(li?.modifiedAt));
    eq("getFileInfo directory", info["/tmp/js/sub"]?.type, "directory");
    eq("info of a missing file", await statusOf(() => f.getFileInfo(["/tmp/js/missing"])), 404);
    const listed = await f.listDirectory({ path: "/tmp/js", depth: 2 });
    eq("listDirectory depth 2", listed.map((e) => e.path),
      ["/tmp/js/lines.txt", "/tmp/js/sub", "/tmp/js/sub/data.bin", "/tmp/js/sub/notes.md"]);
    const found = await f.search({ path: "/tmp/js", pattern: "*.md" });
    eq("search *.md", found.map((e) => e.path), ["/tmp/js/sub/notes.md"]);
  });

  await step("replace and permissions", async () => {
    const res = await f.replaceContentsDetailed([{ path: "/tmp/js/sub/notes.md", oldContent: "alpha", newContent: "gamma" }]);
    eq("replaceContentsDetailed", res, [{ path: "/tmp/js/sub/notes.md", replacedCount: 2 }]);
    await f.replaceContents([{ path: "/tmp/js/sub/notes.md", oldContent: "beta", newContent: "delta" }]);
    eq("file after replace", await f.readFile("/tmp/js/sub/notes.md"), "# notes\ngamma delta gamma\n");
    await f.setPermissions([{ path: "/tmp/js/sub/notes.md", mode: 600 }]);
    eq("mode after setPermissions", (await f.getFileInfo(["/tmp/js/sub/notes.md"]))["/tmp/js/sub/notes.md"].mode, 600);
  });

  await step("move and delete", async () => {
    await f.moveFiles([{ src: "/tmp/js/sub/notes.md", dest: "/tmp/js/moved/notes.md" }]);
    eq("moved file", await f.readFile("/tmp/js/moved/notes.md"), "# notes\ngamma delta gamma\n");
    eq("source after move", await statusOf(() => f.getFileInfo(["/tmp/js/sub/notes.md"])), 404);
    await f.deleteFiles(["/tmp/js/moved/notes.md"]);
    eq("deleted file", await statusOf(() => f.readFile("/tmp/js/moved/notes.md")), 404);
    await f.deleteDirectories(["/tmp/js"]);
    eq("deleted directory", await statusOf(() => f.getFileInfo(["/tmp/js"])), 404);
  });

  // A large file streamed up and down: the SDK sends an AsyncIterable as
  // one multipart part and yields the download as chunks.
  await step("streamed upload and download", async () => {
    const chunk = randomBytes(256 * 1024);
    const n = 12;
    const want = createHash("sha256");
    for (let i = 0; i < n; i++) want.update(chunk);
    const digest = want.digest("hex");
    async function* parts() {
      for (let i = 0; i < n; i++) yield new Uint8Array(chunk);
    }
    await f.writeFiles([{ path: "/tmp/big/blob", data: parts() }]);
    const inside = await sbx.commands.run("sha256sum /tmp/big/blob");
    eq("uploaded file inside", lines(inside.logs.stdout)[0]?.split(" ")[0], digest);
    const got = createHash("sha256");
    let size = 0;
    let chunks = 0;
    for await (const c of f.readBytesStream("/tmp/big/blob")) {
      got.update(c);
      size += c.length;
      chunks++;
    }
    eq("downloaded size", size, n * chunk.length);
    eq("downloaded digest", got.digest("hex"), digest);
    check("download arrives in chunks", chunks > 1, `${chunks} chunk(s)`);
  });
}
