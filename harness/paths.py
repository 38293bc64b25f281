"""Where the repository and the read-only shared material are."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
HUB_CONFIG = ROOT / "hub_config"
