// A sandbox's life through the published SDK: create with an image, an
// entrypoint, resources, env and metadata; getInfo; SandboxManager's list
// with state and metadata filters; renew; patchMetadata; metrics;
// pause/resume (state kept, the SDK reconnects); kill. And endpoints:
// execd's (44772) and an app port, in the form of the protocol's Docker
// row, then used: the SDK through the server's proxy route, an HTTP
// server inside the sandbox through both endpoints.
import { Sandbox, SandboxManager } from "@alibaba-group/opensandbox";
import { connection, create, check, eq, env, main, note, readySeconds, sleep, statusOf, step } from "./lib.mjs";

const run = `run-${Date.now()}-${process.pid}`;
const APP_PORT = 8000;

// endpointForm checks an endpoint against the protocol's Docker bridge
// row: scheme-less "host:port/proxy/{port}". The clients that check an
// endpoint (this SDK version does not) accept "host:{port}" or an address
// whose path ends in "/{port}"; the protocol's form passes both.
function endpointForm(name, ep, port) {
  check(`${name} has no scheme`, !ep.endpoint.includes("://"), ep.endpoint);
  check(`${name} is host:port/proxy/${port}`, new RegExp(`^[^/]+:\\d+/proxy/${port}$`).test(ep.endpoint), ep.endpoint);
  const [hostPort, ...path] = ep.endpoint.split("/");
  check(`${name} passes the clients' own check`,
    hostPort.endsWith(`:${port}`) || (path.length > 0 && ep.endpoint.endsWith(`/${port}`)), ep.endpoint);
}

async function getState(manager, id) {
  return (await manager.getSandboxInfo(id)).status.state;
}

async function waitState(manager, id, want) {
  const deadline = Date.now() + readySeconds() * 1000;
  let state;
  while (Date.now() < deadline) {
    state = await getState(manager, id);
    if (state === want) return state;
    await sleep(200);
  }
  return state;
}

// fetchText fetches url with headers until the app answers (not 502),
// for a server that is still starting.
async function fetchText(url, headers) {
  const deadline = Date.now() + 15000;
  for (;;) {
    try {
      const res = await fetch(url, { headers });
      const body = await res.text();
      if (res.status !== 502 || Date.now() > deadline) return { status: res.status, body };
    } catch (err) {
      if (Date.now() > deadline) throw err;
    }
    await sleep(100);
  }
}

await main(async (made) => {
  const manager = SandboxManager.create({ connectionConfig: connection() });
  try {
    const before = Date.now();
    const sbx = await create({
      image: env("OSB_IMAGE"),
      entrypoint: ["/bin/sh", "-c", "echo started > /tmp/entrypoint; exec sleep infinity"],
      resource: { cpu: "500m", memory: "256Mi" },
      env: { JS_SDK_VAR: "from-create" },
      metadata: { suite: "jssdk", run },
      timeoutSeconds: 600,
    });
    made.push(sbx);

    // getInfo reflects the request.
    const info = await sbx.getInfo();
    eq("getInfo state", info.status.state, "Running");
    eq("getInfo id", info.id, sbx.id);
    eq("getInfo metadata", info.metadata, { suite: "jssdk", run });
    eq("getInfo entrypoint", info.entrypoint, ["/bin/sh", "-c", "echo started > /tmp/entrypoint; exec sleep infinity"]);
    eq("getInfo image", info.image?.uri, env("OSB_IMAGE"));
    check("getInfo createdAt is a Date", info.createdAt instanceof Date && !isNaN(info.createdAt), String(info.createdAt));
    const expires = info.expiresAt?.getTime?.() ?? NaN;
    check("getInfo expiresAt is createdAt + 600 s",
      Math.abs(expires - info.createdAt.getTime() - 600_000) < 2000, `${info.createdAt?.toISOString?.()} .. ${info.expiresAt}`);

    // The entrypoint ran, the env reached commands, the resources the container.
    const out = await sbx.commands.run("cat /tmp/entrypoint; echo $JS_SDK_VAR; cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes");
    eq("entrypoint, env and memory limit seen inside", out.logs.stdout.map((m) => m.text),
      ["started", "from-create", String(256 * 1024 * 1024)]);

    // The list, filtered by state and metadata.
    const ids = (r) => r.items.map((s) => s.id);
    const listed = await manager.listSandboxInfos({ states: ["Running"], metadata: { run } });
    eq("list Running with our metadata", ids(listed), [sbx.id]);
    check("list pagination", listed.pagination?.totalItems === 1 && listed.pagination?.page === 1,
      JSON.stringify(listed.pagination));
    eq("list with other metadata", ids(await manager.listSandboxInfos({ metadata: { run: "other" } })), []);
    eq("list Paused with our metadata", ids(await manager.listSandboxInfos({ states: ["Paused"], metadata: { run } })), []);

    // Metrics of the sandbox.
    await step("getMetrics", async () => {
      const m = await sbx.getMetrics();
      check("metrics cpuCount", m.cpuCount > 0, JSON.stringify(m));
      check("metrics memory", m.memoryTotalMiB > 0 && m.memoryUsedMiB > 0 && m.memoryUsedMiB <= m.memoryTotalMiB, JSON.stringify(m));
      check("metrics cpuUsedPercentage", m.cpuUsedPercentage >= 0, JSON.stringify(m));
      check("metrics timestamp is now (ms)", Math.abs(m.timestamp - Date.now()) < 60_000 && m.timestamp >= before - 1000,
        JSON.stringify(m));
    });

    // Renew moves the expiry; the response and getInfo agree.
    await step("renew", async () => {
      const renewed = await sbx.renew(3600);
      const at = new Date(renewed.expiresAt).getTime();
      check("renew answers now + 3600 s", Math.abs(at - Date.now() - 3600_000) < 10_000, String(renewed.expiresAt));
      eq("getInfo after renew", (await sbx.getInfo()).expiresAt?.getTime(), at);
      await manager.renewSandbox(sbx.id, 1800);
      const via = (await sbx.getInfo()).expiresAt?.getTime();
      check("SandboxManager.renewSandbox", Math.abs(via - Date.now() - 1800_000) < 10_000, String(via));
    });

    await step("patchMetadata", async () => {
      const patched = await sbx.patchMetadata({ owner: "js", suite: null });
      eq("patchMetadata answer", patched.metadata, { run, owner: "js" });
      eq("list by patched metadata", ids(await manager.listSandboxInfos({ metadata: { owner: "js", run } })), [sbx.id]);
    });

    // Endpoints: execd and an app port, in the protocol's form.
    const execdEp = await sbx.getEndpoint(44772);
    endpointForm("execd endpoint", execdEp, 44772);
    await sbx.commands.run(`mkdir -p /tmp/www && echo hello-app > /tmp/www/index.html`);
    await sbx.commands.run(`httpd -f -p ${APP_PORT} -h /tmp/www`, { background: true });
    const appEp = await sbx.getEndpoint(APP_PORT);
    endpointForm("app endpoint", appEp, APP_PORT);
    await step("app through its endpoint", async () => {
      const r = await fetchText(`http://${appEp.endpoint}/index.html`, appEp.headers);
      eq("app through its endpoint", [r.status, r.body], [200, "hello-app\n"]);
    });

    // The same sandbox through the server's proxy route, as a user behind
    // a network that cannot reach the sandbox's ports would use it.
    await step("useServerProxy", async () => {
      const viaProxy = await Sandbox.connect({
        sandboxId: sbx.id,
        connectionConfig: connection({ useServerProxy: true }),
        readyTimeoutSeconds: readySeconds(),
      });
      try {
        const ep = await viaProxy.getEndpoint(APP_PORT);
        check("server-proxy endpoint form", new RegExp(`^[^/]+/sandboxes/${sbx.id}/proxy/${APP_PORT}$`).test(ep.endpoint), ep.endpoint);
        const r = await fetchText(`http://${ep.endpoint}/index.html`, ep.headers);
        eq("app through the server proxy", [r.status, r.body], [200, "hello-app\n"]);
        const ex = await viaProxy.commands.run("echo via-proxy");
        eq("command through the server proxy", ex.logs.stdout.map((m) => m.text), ["via-proxy"]);
      } finally {
        await viaProxy.close();
      }
    });

    // Pause keeps the state; resume returns a connected instance.
    await sbx.files.writeFiles([{ path: "/tmp/kept", data: "before-pause" }]);
    await sbx.pause();
    eq("state after pause", await waitState(manager, sbx.id, "Paused"), "Paused");
    eq("list Paused", ids(await manager.listSandboxInfos({ states: ["Paused"], metadata: { run } })), [sbx.id]);
    const resumed = await sbx.resume({ readyTimeoutSeconds: readySeconds() });
    // The resumed instance shares the first one's connection (closing
    // either closes both), so the first is only dropped.
    made.push(resumed);
    made.splice(made.indexOf(sbx), 1);
    eq("state after resume", await waitState(manager, resumed.id, "Running"), "Running");
    eq("file kept across pause", await resumed.files.readFile("/tmp/kept"), "before-pause");

    // Kill: the sandbox goes away.
    made.splice(made.indexOf(resumed), 1);
    await resumed.kill();
    await resumed.close();
    let gone = 0;
    const deadline = Date.now() + readySeconds() * 1000;
    while (Date.now() < deadline) {
      gone = await statusOf(() => manager.getSandboxInfo(resumed.id));
      if (gone === 404) break;
      await sleep(200);
    }
    eq("getSandboxInfo after kill", gone, 404);
    note(`execd endpoint ${execdEp.endpoint}, app endpoint ${appEp.endpoint}`);
  } finally {
    await manager.close();
  }
});
