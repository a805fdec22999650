"""``grouppref demo``: the whole pipeline on the embedded defaults (offline, CPU).

The demo is ``examples/demo.yaml`` run by the same code as ``grouppref run``; ``--quick``
shrinks it (8 prompts, K=3, short answers, 2 training steps) for a smoke test; ``--human``
replaces the simulated panel by people ranking in a local Argilla.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from grouppref.commands.output import err
from grouppref.commands.run import print_outcome
from grouppref.config import load_config
from grouppref.errors import ConfigError
from grouppref.labeling.config import LabelRunConfig, PushConfig

if TYPE_CHECKING:
    from grouppref.runner import RunConfig

ROOT = Path(__file__).resolve().parents[2]
DEMO_CONFIG = ROOT / "examples" / "demo.yaml"
DEMO_PROMPTS = ROOT / "data" / "demo_prompts.jsonl"


def demo_config(out: Path, quick: bool = False) -> RunConfig:
    """The demo's validated :class:`~grouppref.runner.RunConfig`, writing into ``out``.

    Raises:
        ConfigError: the demo config lacks one of the sections the demo changes.
    """
    from grouppref.runner import RunConfig

    cfg = load_config(RunConfig, DEMO_CONFIG, overrides={"run_dir": str(out)})
    prompts, generate, train, validation = cfg.prompts, cfg.generate, cfg.train, cfg.validation
    if prompts is None or generate is None or train is None or validation is None:
        raise ConfigError(f"{DEMO_CONFIG} needs the prompts, generate, train and validation "
                          "sections")
    updates: dict[str, Any] = {"prompts": prompts.model_copy(update={"source": str(DEMO_PROMPTS)})}
    updates["export"] = [e.model_copy(update={"to_dir": str(out / "export" / "groups")})
                         if e.to_dir else e for e in cfg.export]
    if quick:
        updates["prompts"] = updates["prompts"].model_copy(update={"limit": 8})
        # re-validated, since the counts per model follow from k
        updates["generate"] = type(generate).model_validate(
            {**generate.model_dump(), "k": 3, "max_new_tokens": 16,
             "models": [{"name": "embedded"}]})
        updates["train"] = train.model_copy(update={"max_steps": 2, "batch_size": 2})
        updates["validation"] = validation.model_copy(update={"test_fraction": 0.3})
    return cfg.model_copy(update=updates)


def human_config(cfg: RunConfig, state_dir: Path, annotators: int) -> RunConfig:
    """The demo with people instead of the simulated panel: push, wait, pull."""
    label = LabelRunConfig(state_dir=str(state_dir), min_rankings=annotators, poll_seconds=10,
                           push=PushConfig(min_submitted=annotators, suggest_from="ensemble"))
    return cfg.model_copy(update={"simulate": None, "label": label})


def _accounts(server: Any, count: int) -> list[tuple[str, str]]:
    """Annotator logins ``annotator-1..N`` (made once; kept in the 0600 credentials file)."""
    from grouppref.labeling.server.credentials import load_credentials

    known = load_credentials(server.credentials_path).users
    logins = []
    for i in range(1, count + 1):
        name = f"annotator-{i}"
        if name in known:
            logins.append((name, known[name].password))
        else:
            user, password, _ = server.create_user(name, role="annotator")
            logins.append((user, password))
    return logins


def demo(
    out: Annotated[Path, typer.Option("--out", help="Run directory.")] = Path("runs/demo"),
    force: Annotated[bool, typer.Option("--force", help="Re-run every stage.")] = False,
    quick: Annotated[bool, typer.Option(help="A small, fast version (smoke test).")] = False,
    human: Annotated[bool, typer.Option(help="Rank in the Argilla web UI instead of the "
                                        "simulated panel (starts a local Argilla).")] = False,
    annotators: Annotated[int, typer.Option(help="With --human: annotator accounts, and "
                                            "rankings needed per group.")] = 1,
    port: Annotated[int, typer.Option(help="With --human: the Argilla port.")] = 6900,
) -> None:
    """Run the demo pipeline end to end on the shipped prompts and embedded models."""
    from grouppref.labeling.server.embedded import EmbeddedArgilla, ServerConfig
    from grouppref.runner import run_pipeline

    cfg = demo_config(out, quick=quick)
    forced = ["all"] if force else None
    if not human:
        print_outcome(run_pipeline(cfg, force=forced, console=err), cfg.run_dir)
        return
    state_dir = out / "argilla"
    with EmbeddedArgilla(ServerConfig(state_dir=state_dir, port=port)) as server:
        logins = _accounts(server, annotators)
        err.print(f"[bold]Argilla[/] is up at {server.url} - log in as:", highlight=False)
        for user, password in logins:
            err.print(f"  {user} / {password}", highlight=False)
        err.print("Rank each group in the web UI; the demo goes on once every group has "
                      f"{annotators} submitted ranking(s). Ctrl-C stops (state is kept).")
        outcome = run_pipeline(human_config(cfg, state_dir, annotators), force=forced,
                               wait=True, console=err)
    print_outcome(outcome, cfg.run_dir)


def register(app: typer.Typer) -> None:
    app.command()(demo)
