"""The multiple-choice tasks' base (SWAG, RACE; objective `choice`): an example is a context and its candidate
endings, the number of choices comes from the data and is kept with the run, and each split is found the same
way — the --train/--dev/--test options, else the task's own names in --data-dir (a file option wins over the
folder for its split), with the same one-line errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from plmcli.data.tasks import Task
from plmcli.errors import PlmError

SPLITS = ("train", "dev", "test")


@dataclass
class ChoiceExample:
    """One multiple-choice question: a context and its candidate endings (objective `choice`)."""

    context: str
    endings: list
    label: int | None = None
    """Index of the right ending; None where the split is unlabeled."""
    id: str | None = None
    """The row's index column (the file's leading unnamed column), else its position among the examples."""


@dataclass(frozen=True)
class SplitFiles:
    """Where a multiple-choice task finds its splits, and what its errors say."""

    names: dict
    """split -> the names looked for in --data-dir, the first found wins and the first is named in errors; a
    trailing "/" names a folder."""
    holding: str
    """What --data-dir holds, for the hint: "SWAG's train.csv and val.csv (and test.csv)"."""
    needs: str
    """What finetuning needs, when train or dev is missing: "a train and a dev file"."""
    given: str
    """What a split passed as an option is: "file", "data" (a file or a folder)."""
    how: str
    """The hint when train or dev is missing."""
    existing: str
    """The hint when a path given does not exist."""
    folders: bool = False
    """A split may be a folder (RACE's download): a --train/--dev/--test folder is read whole."""


@dataclass
class ChoiceTask(Task):
    """A multiple-choice task (SWAG, RACE): the number of choices comes from the data and is kept with the run."""

    objective: str = "choice"
    num_labels: int = 4
    """The number of choices, taken from the data."""
    metrics: tuple = ("accuracy",)
    main_metric: str = "accuracy"
    eval_splits: dict = field(default_factory=lambda: {"dev": ""})
    split_files: ClassVar[SplitFiles]
    """Where the subclass's splits are found (`files`)."""

    def choice_name(self, i: int) -> str:
        """How choice i is named in predictions (SWAG: its index)."""
        return str(i)

    def state(self) -> dict:
        return {"choices": self.num_labels}

    def restore(self, state: dict) -> None:
        self.set_choices(int(state.get("choices", self.num_labels)))

    def set_choices(self, k: int) -> None:
        self.num_labels = k
        self.label_names = tuple(self.choice_name(i) for i in range(k))

    def files(self, data_dir: str | None) -> dict[str, Path]:
        """Split -> file (or folder, where `split_files.folders`): the --train/--dev/--test options, else the first
        of `split_files.names` that --data-dir holds. Train and dev are needed; test is read when found."""
        layout, o = self.split_files, self.options
        paths = {s: Path(f) for s, f in zip(SPLITS, (o.train, o.dev, o.test)) if f}
        if data_dir is not None:
            root = Path(data_dir)
            if not root.is_dir():
                raise PlmError(f"--data-dir {root} is not a directory", f"pass the folder holding {layout.holding}")
            for split, names in layout.names.items():
                found = [root / n for n in names if (root / n).is_dir() == n.endswith("/") and (root / n).exists()]
                if split not in paths and found:
                    paths[split] = found[0]
        missing = [s for s in ("train", "dev") if s not in paths]
        if missing:
            where = f"--data-dir {data_dir} has no {' or '.join(layout.names[s][0] for s in missing)}" if data_dir \
                else f"no {' or '.join(missing)} {layout.given} given"
            raise PlmError(f"{where}: {self.name.upper()} finetuning needs {layout.needs}", layout.how)
        for path in paths.values():
            if not (path.exists() if layout.folders else path.is_file()):
                raise PlmError(f"{path} not found", layout.existing)
        return paths
