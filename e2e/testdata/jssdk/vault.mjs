// Drives the credential vault calls of the published OpenSandbox
// JavaScript SDK against the server named by the environment (as
// egress.mjs does) and prints one JSON line for TestJSSDKVault:
//
//   OSB_DOMAIN, OSB_API_KEY, OSB_IMAGE, OSB_READY_SECONDS  as egress.mjs
//   OSB_SECRET         the credential's value (it must never come back)
import { Sandbox, ConnectionConfig } from "@alibaba-group/opensandbox";

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

// status runs fn and returns the HTTP status it failed with, 0 if it did
// not fail.
const status = async (fn) => {
  try {
    await fn();
    return 0;
  } catch (err) {
    return err?.statusCode ?? err?.status ?? -1;
  }
};

const binding = (name, path) => ({
  name,
  match: { hosts: ["provider.test"], paths: [path] },
  auth: { type: "bearer", credential: "key" },
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
    networkPolicy: { defaultAction: "deny", egress: [{ action: "allow", target: "provider.test" }] },
    credentialProxy: { enabled: true },
  });
  summary.id = sbx.id;
  const vault = sbx.credentialVault;
  summary.created = await vault.create({
    credentials: [{ name: "key", source: { type: "inline", value: env("OSB_SECRET") } }],
    bindings: [binding("models", "/v1/*")],
  });
  summary.secondCreate = await status(() => vault.create({ credentials: [], bindings: [] }));
  summary.got = await vault.get();
  summary.credentials = await vault.listCredentials();
  summary.credential = await vault.getCredential("key");
  summary.bindings = await vault.listBindings();
  summary.binding = await vault.getBinding("models");
  summary.missing = await status(() => vault.getBinding("nope"));
  summary.stale = await status(() =>
    vault.patch({ expectedRevision: 7, bindings: { add: [binding("files", "/files/*")] } }),
  );
  summary.invalid = await status(() =>
    vault.patch({ bindings: { add: [{ ...binding("ip", "/x"), match: { hosts: ["10.0.0.1"] } }] } }),
  );
  summary.patched = await vault.patch({
    expectedRevision: summary.got.revision,
    bindings: { add: [binding("files", "/files/*")] },
  });
  await vault.delete();
  summary.afterDelete = await status(() => vault.get());
} catch (err) {
  summary.error = String(err?.stack ?? err);
  if (err?.statusCode) summary.errorStatus = err.statusCode;
} finally {
  if (sbx) {
    try {
      await sbx.kill();
    } catch {}
  }
}
console.log(JSON.stringify(summary));
