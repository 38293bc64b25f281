/** The side panel and the status-bar item: plain DOM, redrawn whole on every poll. */
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { IGpu, IMachine, gpuSummary, statusText, whenText } from './machine';

const GPU_SVG = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16" height="16">
<g class="jp-icon3" fill="#616161"><path d="M7 7h10v10H7z" fill-opacity=".35"/>
<path d="M5 5h14v14H5zm2 2v10h10V7zM8 1h2v3H8zm6 0h2v3h-2zM8 20h2v3H8zm6 0h2v3h-2zM1 8h3v2H1zm0 6h3v2H1zm19-6h3v2h-3zm0 6h3v2h-3z"/>
</g></svg>`;

export const gpuIcon = new LabIcon({ name: 'composespawner-lab:gpu', svgstr: GPU_SVG });

/** What the panel's buttons do; the plugin supplies them. */
export interface IActions {
  grow(): void;
  giveBack(gpu: IGpu): void;
  keep(gpu: IGpu): void;
}

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  content = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  node.textContent = content;
  return node;
}

function button(label: string, className: string, onClick: () => void): HTMLButtonElement {
  const node = element('button', `jp-Button jp-mod-styled ${className}`, label);
  node.addEventListener('click', onClick);
  return node;
}

export class MachinePanel extends Widget {
  constructor(private readonly actions: IActions) {
    super();
    this.id = 'composespawner-machine';
    this.addClass('jp-ComposeMachine');
    this.title.icon = gpuIcon;
    this.title.caption = 'Your machine: its GPUs';
    this.render(null, 'Asking the GPU portal about your machine…', false);
  }

  /** Draw the machine (null: not known yet) with a line for the latest problem. */
  render(machine: IMachine | null, problem: string | null, busy: boolean): void {
    const root = this.node;
    root.replaceChildren(element('h2', 'jp-ComposeMachine-title', 'Your machine'));
    if (machine !== null) {
      root.append(element('div', 'jp-ComposeMachine-summary', statusText(machine)));
      const list = element('ul', 'jp-ComposeMachine-gpus');
      for (const gpu of machine.gpus) {
        list.append(this.gpuRow(gpu, busy));
      }
      root.append(list);
      if (machine.gpus.length === 0) {
        root.append(element('p', 'jp-ComposeMachine-none', `This server holds ${gpuSummary(machine)}.`));
      }
    }
    const grow = button('Add a GPU', 'jp-mod-accept jp-ComposeMachine-grow', () =>
      this.actions.grow()
    );
    grow.disabled = busy;
    root.append(grow);
    if (problem !== null) {
      root.append(element('p', 'jp-ComposeMachine-problem', problem));
    }
  }

  private gpuRow(gpu: IGpu, busy: boolean): HTMLLIElement {
    const row = element('li', 'jp-ComposeMachine-gpu');
    row.dataset.gpu = gpu.id;
    row.append(element('span', 'jp-ComposeMachine-model', `${gpu.model} · ${gpu.id}`));
    if (gpu.idleSeconds !== null) {
      const minutes = Math.floor(gpu.idleSeconds / 60);
      row.append(element('span', 'jp-ComposeMachine-idle', ` · idle ${minutes} min`));
    }
    const giveBack = button('Give back', 'jp-mod-warn jp-ComposeMachine-giveback', () =>
      this.actions.giveBack(gpu)
    );
    giveBack.disabled = busy;
    row.append(giveBack);
    if (gpu.warning !== null) {
      const at = whenText(gpu.warning.reclaimAt, new Date());
      row.append(element('div', 'jp-ComposeMachine-warning', `Idle: goes back to the pool ${at}.`));
      if (gpu.warning.keepAllowed) {
        const keep = button('Keep', 'jp-mod-accept jp-ComposeMachine-keep', () =>
          this.actions.keep(gpu)
        );
        keep.disabled = busy;
        row.append(keep);
      }
    }
    return row;
  }
}

/** The status bar's item: the machine in a few words; a click opens the panel. */
export class MachineStatus extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('jp-ComposeStatus');
    this.node.title = 'Your machine (click for its GPUs)';
    this.node.textContent = 'GPU portal…';
    this.node.addEventListener('click', onClick);
  }

  setText(text: string): void {
    this.node.textContent = text;
  }
}
