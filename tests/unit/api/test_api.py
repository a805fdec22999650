"""``grouppref.api``: every published name resolves to the object its module defines, and
importing the API loads neither torch nor a stage module until a name is used."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from grouppref import api


@pytest.mark.parametrize("name", sorted(api.EXPORTS))
def test_each_name_is_its_modules_object(name: str) -> None:
    assert getattr(api, name) is getattr(importlib.import_module(api.EXPORTS[name]), name)


def test_unknown_name_says_which_names_exist() -> None:
    with pytest.raises(AttributeError, match="its names: .*run_validate"):
        api.run_everything  # noqa: B018


def test_import_is_light() -> None:
    code = ("import sys, grouppref.api as a; "
            "assert 'torch' not in sys.modules, 'torch'; "
            "assert not [m for m in sys.modules if m.startswith('grouppref.pipeline')]; "
            "a.ValidateConfig; assert 'torch' not in sys.modules, 'validate loaded torch'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
