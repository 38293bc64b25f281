// A real OpenID Connect provider for the tests: panva's oidc-provider (OpenID
// certified), served over HTTPS on 127.0.0.1, as a campus identity provider is.
//
//   node provider.mjs CONFIG.json
//
// CONFIG: {"issuer", "port", "tls_cert", "tls_key", "users_file", "clients": [...]}.
// USERS_FILE: {"<login>": {"password", "email", "name", "groups": [...]}}, read
// again at every login and every claims request, so a test changes a user's
// groups at the provider by rewriting it. Authorization code flow only, PKCE
// (S256) required of every client, ID tokens signed with a fresh RS256 key.
// Prints "listening <issuer>" once it serves.
import { generateKeyPairSync } from "node:crypto";
import { readFileSync } from "node:fs";
import { createServer } from "node:https";

import Provider from "oidc-provider";

const config = JSON.parse(readFileSync(process.argv[2], "utf8"));
const users = () => JSON.parse(readFileSync(config.users_file, "utf8"));
const SCOPES = "openid profile email groups";

function claimsOf(login) {
  const user = users()[login];
  if (user === undefined) return undefined;
  return {
    sub: login,
    preferred_username: login,
    name: user.name ?? login,
    email: user.email,
    email_verified: true,
    groups: user.groups ?? [],
  };
}

const signingKey = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey;

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: { keys: [{ ...signingKey.export({ format: "jwk" }), kid: "test-rs256", use: "sig", alg: "RS256" }] },
  cookies: { keys: ["composespawner-test-provider"] },
  claims: {
    openid: ["sub"],
    profile: ["preferred_username", "name"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  scopes: SCOPES.split(" "),
  responseTypes: ["code"],
  pkce: { methods: ["S256"], required: () => true },
  features: { devInteractions: { enabled: false } },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, sub) {
    const claims = claimsOf(sub);
    return claims && { accountId: sub, claims: async () => claimsOf(sub) ?? { sub } };
  },
  // The hub is a first-party client: what it asks for is granted without a consent page.
  async loadExistingGrant(ctx) {
    const grantId =
      ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope(SCOPES);
    await grant.save();
    return grant;
  },
});

const escape = (text) =>
  String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(uid, problem) {
  return `<!doctype html><title>Campus login</title><h1>Campus login</h1>
${problem ? `<p id="problem">${escape(problem)}</p>` : ""}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Username <input name="login" autocomplete="username"></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Log in</button></form>`;
}

async function formBody(req) {
  let body = "";
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 10000) throw new Error("form too large");
  }
  return new URLSearchParams(body);
}

// The login interaction; everything else is the provider's own.
async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new Error("interaction mismatch");
  if (req.method === "GET" && action === undefined) {
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
    res.end(loginPage(uid));
    return;
  }
  if (req.method === "POST" && action === "login") {
    const form = await formBody(req);
    const login = form.get("login") ?? "";
    const user = users()[login];
    if (user === undefined || user.password !== form.get("password")) {
      res.writeHead(200, { "Content-Type": "text/html; charset=utf-8" });
      res.end(loginPage(uid, "Wrong username or password."));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, {
      mergeWithLastSubmission: false,
    });
    return;
  }
  res.writeHead(405).end();
}

const handle = provider.callback();
const server = createServer(
  { cert: readFileSync(config.tls_cert), key: readFileSync(config.tls_key) },
  (req, res) => {
    const match = /^\/interaction\/([\w-]+)(?:\/(login))?$/.exec(req.url.split("?")[0]);
    if (match === null) return handle(req, res);
    interaction(req, res, match[1], match[2]).catch((err) => {
      console.error(err);
      if (!res.headersSent) res.writeHead(400, { "Content-Type": "text/plain" });
      res.end(`interaction failed: ${err.message}`);
    });
  },
);
server.listen(config.port, "127.0.0.1", () => console.log(`listening ${config.issuer}`));
for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => process.exit(0));
