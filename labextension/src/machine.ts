/**
 * The machine as the portal describes it, read defensively: the portal is newer or
 * older than this extension at times, so a field that is missing or of the wrong
 * kind is absent, never a crash. Pure: no DOM, no network.
 */

/** A warning the reclaimer gave for one idle GPU: when it goes, and whether Keep helps. */
export interface IWarning {
  /** When the GPU will be taken if it stays idle (absent: the portal did not say). */
  reclaimAt: Date | null;
  /** The portal's own words, if it sent any. */
  message: string | null;
  /** False when the site's policy allows no (more) Keep presses for this GPU. */
  keepAllowed: boolean;
}

export interface IGpu {
  id: string;
  model: string;
  /** Seconds this GPU has done no work (absent until the portal reports it). */
  idleSeconds: number | null;
  warning: IWarning | null;
}

export interface IMachine {
  server: string;
  host: string | null;
  state: string | null;
  /** 1: whole GPUs; n: this server holds 1/n of its one GPU. */
  gpuShare: number;
  gpus: IGpu[];
}

function text(value: unknown): string | null {
  return typeof value === 'string' && value !== '' ? value : null;
}

function seconds(value: unknown): number | null {
  return typeof value === 'number' && isFinite(value) && value >= 0 ? value : null;
}

function when(value: unknown): Date | null {
  if (typeof value === 'number' && isFinite(value)) {
    return new Date(value * 1000); // epoch seconds, as the reclaimer counts
  }
  if (typeof value === 'string') {
    const parsed = new Date(value);
    return isNaN(parsed.getTime()) ? null : parsed;
  }
  return null;
}

function parseWarning(value: unknown): IWarning | null {
  if (value === null || typeof value !== 'object') {
    return null;
  }
  const raw = value as Record<string, unknown>;
  return {
    reclaimAt: when(raw.reclaim_at),
    message: text(raw.message),
    keepAllowed: raw.keep_allowed !== false
  };
}

function parseGpu(value: unknown): IGpu | null {
  if (value === null || typeof value !== 'object') {
    return null;
  }
  const raw = value as Record<string, unknown>;
  const id = text(raw.id);
  if (id === null) {
    return null; // nothing to give back or keep without an id
  }
  return {
    id,
    model: text(raw.model) ?? 'GPU',
    idleSeconds: seconds(raw.idle_s),
    warning: parseWarning(raw.warning)
  };
}

/** The portal's answer for this server as the extension uses it; null if it is not one. */
export function parseMachine(value: unknown): IMachine | null {
  if (value === null || typeof value !== 'object') {
    return null;
  }
  const raw = value as Record<string, unknown>;
  const share = raw.gpu_share;
  const gpus = Array.isArray(raw.gpus) ? raw.gpus : [];
  return {
    server: text(raw.server) ?? '',
    host: text(raw.host),
    state: text(raw.state),
    gpuShare: typeof share === 'number' && Number.isInteger(share) && share > 1 ? share : 1,
    gpus: gpus.map(parseGpu).filter((g): g is IGpu => g !== null)
  };
}

/** "2× T4", "1× T4, 1× A100", "¼ of a T4", "no GPU". */
export function gpuSummary(machine: IMachine): string {
  if (machine.gpus.length === 0) {
    return 'no GPU';
  }
  if (machine.gpuShare > 1) {
    return `1/${machine.gpuShare} of a ${machine.gpus[0].model}`;
  }
  const counts = new Map<string, number>();
  for (const gpu of machine.gpus) {
    counts.set(gpu.model, (counts.get(gpu.model) ?? 0) + 1);
  }
  return [...counts].map(([model, n]) => `${n}× ${model}`).join(', ');
}

/** Minutes the machine's GPUs have all been idle: the least idle one's; null if unknown. */
export function idleMinutes(machine: IMachine): number | null {
  const idle = machine.gpus.map(g => g.idleSeconds);
  if (idle.length === 0 || idle.some(s => s === null)) {
    return null; // unknown is not idle
  }
  return Math.floor(Math.min(...(idle as number[])) / 60);
}

/** The status bar's words: "host-01 · 1× T4 · idle 12 min". */
export function statusText(machine: IMachine): string {
  const parts = [machine.host ?? 'no host yet', gpuSummary(machine)];
  const idle = idleMinutes(machine);
  if (idle !== null && idle > 0) {
    parts.push(`idle ${idle} min`);
  }
  return parts.join(' · ');
}

/** When, in the user's words: "at 14:05 (in 12 min)". */
export function whenText(at: Date | null, now: Date): string {
  if (at === null) {
    return 'once it has been idle long enough'; // the portal's message says more
  }
  const minutes = Math.max(0, Math.round((at.getTime() - now.getTime()) / 60000));
  const clock = at.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  return `at ${clock} (in ${minutes} min)`;
}

/**
 * The notification for one warned GPU: when it goes and how to keep it, first, as
 * JupyterLab's toasts show only a message's first 140 characters (the notification
 * centre shows it all).
 */
export function warningText(gpu: IGpu, now: Date): string {
  const warning = gpu.warning;
  if (warning === null) {
    return '';
  }
  const keep = warning.keepAllowed ? 'use it or press Keep' : 'use it (no Keep presses left)';
  const said = warning.message !== null ? ` ${warning.message}` : '';
  return (
    `Idle ${gpu.model} (${gpu.id}) goes back to the pool ${whenText(warning.reclaimAt, now)}. ` +
    `To keep it, ${keep}.${said}`
  );
}

/** A key per warning, so each is shown once (a new warning for the same GPU is new). */
export function warningKey(gpu: IGpu): string {
  const at = gpu.warning?.reclaimAt;
  return `${gpu.id}@${at ? at.toISOString() : ''}`;
}
