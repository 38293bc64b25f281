/** Calls to this server's /compose endpoints (the server extension talks to the portal). */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** What went wrong, in the words the portal or the server extension chose for the user. */
export class ComposeError extends Error {}

export async function requestCompose(
  endpoint: string,
  init: RequestInit = {}
): Promise<unknown> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'compose', endpoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ComposeError(`The notebook server did not answer (${error}); try again.`);
  }
  let body: unknown = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const said =
      body !== null && typeof body === 'object'
        ? (body as Record<string, unknown>).message
        : undefined;
    throw new ComposeError(
      typeof said === 'string' ? said : `The server answered ${response.status}.`
    );
  }
  return body;
}

export function post(endpoint: string, body: object): Promise<unknown> {
  return requestCompose(endpoint, { method: 'POST', body: JSON.stringify(body) });
}
