/**
 * composespawner-lab: this server's composed machine in JupyterLab. It polls the
 * server extension's GET /compose/machine (which asks the GPU portal), shows the
 * machine in the status bar and a side panel (Add a GPU, Give back, Keep), and the
 * reclaimer's warnings as notifications, each once.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IStatusBar } from '@jupyterlab/statusbar';

import { ComposeError, post, requestCompose } from './api';
import { IGpu, IMachine, parseMachine, statusText, warningKey, warningText } from './machine';
import { MachinePanel, MachineStatus } from './panel';

const DEFAULT_POLL_SECONDS = 30;

/** Seconds between polls: the page config's composespawnerPollSeconds, else 30. */
function pollSeconds(configured: string): number {
  const value = Number(configured);
  return configured !== '' && isFinite(value) && value >= 1 ? value : DEFAULT_POLL_SECONDS;
}

function said(error: unknown): string {
  return error instanceof ComposeError ? error.message : `Something went wrong: ${error}`;
}

class MachineWatch {
  private machine: IMachine | null = null;
  private busy = false;
  private problem: string | null = null;
  private readonly warned = new Set<string>();
  private readonly toasts = new Map<string, string>(); // warning key -> notification id
  private readonly givenBack = new Set<string>(); // by the user here: not news to them
  private timer: number | undefined;

  constructor(
    private readonly panel: MachinePanel,
    private readonly status: MachineStatus | null,
    private readonly intervalMs: number
  ) {}

  readonly actions = {
    grow: () => this.act(async () => this.resized(await post('grow', { count: 1 }))),
    giveBack: (gpu: IGpu) =>
      this.act(async () => {
        this.givenBack.add(gpu.id);
        this.resized(await post('give-back', { gpu: gpu.id }));
      }),
    keep: (gpu: IGpu) => this.keep(gpu)
  };

  async poll(): Promise<void> {
    window.clearTimeout(this.timer);
    try {
      const machine = parseMachine(await requestCompose('machine'));
      if (machine === null) {
        throw new ComposeError('The GPU portal sent something that is not a machine.');
      }
      this.noticeDetached(machine);
      this.machine = machine;
      this.problem = null;
      this.announceWarnings(machine);
    } catch (error) {
      this.problem = said(error); // keep showing the last machine we knew
    }
    this.draw();
    this.timer = window.setTimeout(() => void this.poll(), this.intervalMs);
  }

  private draw(): void {
    this.panel.render(this.machine, this.problem, this.busy);
    if (this.status !== null) {
      this.status.setText(this.machine !== null ? statusText(this.machine) : 'GPU portal: no answer');
    }
  }

  private async act(step: () => Promise<void>): Promise<void> {
    this.busy = true;
    this.draw();
    try {
      await step();
    } catch (error) {
      Notification.error(said(error), { autoClose: 8000 });
    } finally {
      this.busy = false;
    }
    await this.poll();
  }

  private resized(answer: unknown): void {
    const next =
      answer !== null && typeof answer === 'object'
        ? (answer as Record<string, unknown>).next_step
        : undefined;
    if (typeof next === 'string') {
      Notification.success(next, { autoClose: 15000 });
    }
  }

  private async keep(gpu: IGpu): Promise<void> {
    await this.act(async () => {
      const answer = await post('keep', { gpu: gpu.id });
      const message =
        answer !== null && typeof answer === 'object'
          ? (answer as Record<string, unknown>).message
          : undefined;
      Notification.success(typeof message === 'string' ? message : `Kept ${gpu.model} (${gpu.id}).`, {
        autoClose: 8000
      });
    });
  }

  private announceWarnings(machine: IMachine): void {
    for (const gpu of machine.gpus) {
      if (gpu.warning === null || this.warned.has(warningKey(gpu))) {
        continue;
      }
      this.warned.add(warningKey(gpu));
      const actions = gpu.warning.keepAllowed
        ? [{ label: 'Keep', caption: 'Keep this GPU', callback: () => void this.keep(gpu) }]
        : [];
      const id = Notification.warning(warningText(gpu, new Date()), { autoClose: false, actions });
      this.toasts.set(warningKey(gpu), id);
    }
    // A warning the portal no longer gives (kept, used again, taken) is no longer true.
    const current = new Set(machine.gpus.filter(g => g.warning !== null).map(warningKey));
    for (const [key, id] of this.toasts) {
      if (!current.has(key)) {
        Notification.dismiss(id);
        this.toasts.delete(key);
      }
    }
  }

  /** A GPU gone since the last poll that the user did not give back here: say so. */
  private noticeDetached(now: IMachine): void {
    if (this.machine === null) {
      return;
    }
    const held = new Set(now.gpus.map(g => g.id));
    for (const gpu of this.machine.gpus) {
      if (!held.has(gpu.id) && !this.givenBack.delete(gpu.id)) {
        Notification.info(
          `Your idle ${gpu.model} (${gpu.id}) went back to the pool; your server, files ` +
            'and other kernels are as they were. Add a GPU gets one again.',
          { autoClose: false }
        );
      }
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'composespawner-lab:plugin',
  description: 'Your composed machine: its GPUs, Add a GPU / Give back / Keep, and idle warnings.',
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    const watch: { current: MachineWatch | null } = { current: null };
    const panel = new MachinePanel({
      grow: () => watch.current?.actions.grow(),
      giveBack: gpu => watch.current?.actions.giveBack(gpu),
      keep: gpu => watch.current?.actions.keep(gpu)
    });
    app.shell.add(panel, 'left', { rank: 900 });
    let status: MachineStatus | null = null;
    if (statusBar !== null) {
      status = new MachineStatus(() => app.shell.activateById(panel.id));
      statusBar.registerStatusItem('composespawner-lab:machine', { item: status, align: 'left', rank: 100 });
    }
    const seconds = pollSeconds(PageConfig.getOption('composespawnerPollSeconds'));
    watch.current = new MachineWatch(panel, status, seconds * 1000);
    void app.restored.then(() => watch.current?.poll());
  }
};

export default plugin;
