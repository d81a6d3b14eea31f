// Drives the egress calls of the published OpenSandbox JavaScript SDK
// against the server named by the environment, and prints what the
// server answered as one JSON line for TestJSSDKEgress to check:
//
//   OSB_DOMAIN         the server's host:port (no scheme)
//   OSB_API_KEY        its API key
//   OSB_IMAGE          the sandbox image
//   OSB_READY_SECONDS  how long the SDK may wait for the sandbox to be ready
//
// Everything but the policy status goes through the SDK's public API. The
// SDK's getEgressPolicy returns only the policy, so the status (mode,
// enforcementMode) is read with the SDK's own egress client (its
// "internal" entry point) on the endpoint the SDK resolved, with the
// headers the server gave for it.
import { Sandbox, ConnectionConfig } from "@alibaba-group/opensandbox";
import { createEgressClient } from "@alibaba-group/opensandbox/internal";

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

const connectionConfig = new ConnectionConfig({
  domain: env("OSB_DOMAIN"),
  apiKey: env("OSB_API_KEY"),
  requestTimeoutSeconds: 120,
});

const summary = {};
let sbx;
try {
  sbx = await Sandbox.create({
    connectionConfig,
    image: env("OSB_IMAGE"),
    entrypoint: ["sleep", "infinity"],
    resource: { cpu: "1", memory: "512Mi" },
    timeoutSeconds: 1800,
    readyTimeoutSeconds: Number(env("OSB_READY_SECONDS")),
    networkPolicy: {
      defaultAction: "deny",
      egress: [{ action: "allow", target: "allowed.test" }],
    },
  });
  summary.id = sbx.id;
  summary.state = (await sbx.getInfo()).status.state;

  const ep = await sbx.getEndpoint(18080);
  summary.endpoint = ep.endpoint;
  summary.endpointHeaders = Object.keys(ep.headers ?? {}).sort();

  summary.before = await sbx.getEgressPolicy();
  await sbx.patchEgressRules([
    { action: "allow", target: "files.allowed.test" },
    { action: "deny", target: "allowed.test" },
  ]);
  summary.afterPatch = await sbx.getEgressPolicy();

  const egress = createEgressClient({
    baseUrl: await sbx.getEndpointUrl(18080),
    headers: ep.headers,
  });
  const { data, error, response } = await egress.GET("/policy");
  if (error || !response.ok) {
    throw new Error(`GET /policy: HTTP ${response.status}: ${JSON.stringify(error)}`);
  }
  summary.status = { mode: data.mode, enforcementMode: data.enforcementMode };

  await sbx.deleteEgressRules(["files.allowed.test"]);
  summary.afterDelete = await sbx.getEgressPolicy();
} catch (err) {
  summary.error = String(err?.stack ?? err);
  if (err?.statusCode) summary.errorStatus = err.statusCode;
  if (err?.error) summary.errorDetail = { code: err.error.code, message: err.error.message };
} finally {
  if (sbx) {
    try {
      await sbx.kill();
      summary.killed = true;
    } catch (err) {
      summary.killError = String(err);
    }
    await sbx.close();
  }
}
console.log(JSON.stringify(summary));
