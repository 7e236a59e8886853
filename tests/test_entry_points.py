"""Entry points fail cleanly on damaged or missing inputs: one line naming the file and the fix.

* ``geoarray gauge check/fix --checkpoint F`` without the safetensors package (the ``gauge`` extra):
  one line on stderr naming the extra, exit code 2 (was a ModuleNotFoundError traceback);
* an empty or truncated safetensors file: one line naming the file, exit code 2 (was a
  ``SafetensorError`` traceback); ``geoarray.models.load_checkpoint`` raises ValueError naming it;
* ``geoarray.train.load_checkpoint`` on a truncated ``params.npz``: ValueError naming the file and no
  ``ResourceWarning`` (was a raw ``BadZipFile`` and an unclosed file).
"""

from __future__ import annotations

import gc
import sys
import warnings

import pytest

from geoarray import nn, optim
from geoarray.cli import main
from geoarray.models import ClassificationTransformer, TransformerLM
from geoarray.models import load_checkpoint as load_lm
from geoarray.models import save_checkpoint as save_lm
from geoarray.train import fit, list_checkpoints, load_checkpoint


@pytest.fixture
def lm_file(tmp_path, backend):
    if backend.name != "numpy":
        pytest.skip("safetensors files are read on the host, the same code for every backend; numpy session only")
    pytest.importorskip("safetensors")
    import array_api_compat.numpy as np_xp

    cfg = dict(arch="bert", n_layers=1, n_heads=2, d_head=2, d_model=4, d_ff=4, vocab=8, n_ctx=4, norm_eps=1e-5)
    model = TransformerLM(cfg)
    path = tmp_path / "lm.safetensors"
    save_lm(path, model, model.init(0, xp=np_xp), dtype="float64")
    return path


def test_gauge_without_safetensors_is_one_line(lm_file, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "safetensors.numpy", None)
    assert main(["gauge", "check", "--checkpoint", str(lm_file), "--numerical", "no"]) == 2
    assert main(["gauge", "fix", "--checkpoint", str(lm_file), "--out", str(tmp_path / "f.safetensors")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("pip install 'geoarray-ml[gauge]'" in line for line in err), err


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_damaged_safetensors_is_one_line(lm_file, capsys, damage):
    raw = lm_file.read_bytes()
    lm_file.write_bytes(b"" if damage == "empty" else raw[: len(raw) // 2])
    assert main(["gauge", "check", "--checkpoint", str(lm_file), "--numerical", "no"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "lm.safetensors" in err[0] and "damaged, truncated" in err[0], err
    with pytest.raises(ValueError, match=r"lm\.safetensors.*damaged"):
        load_lm(lm_file)


def test_truncated_params_npz_is_a_valueerror_without_resource_warning(xp, device, tmp_path):
    model = ClassificationTransformer(4, 2, 3, n_heads=2, n_layers=1)
    params = model.init(0, xp=xp, dtype="float64", device=device)
    x = xp.zeros((8, 2, 4), dtype=xp.float64, device=device)
    y = xp.zeros((8, 3), dtype=xp.float64, device=device)
    fit(model, params, (x, y), optim.Adam(), nn.ClassificationL2Loss(), epochs=1, batch_size=8, progress=False,
        jit=False, checkpoint_path=tmp_path / "ck")  # fmt: skip
    ckpt = list_checkpoints(tmp_path / "ck")[-1][1]
    f = tmp_path / "ck" / ckpt / "params.npz"
    f.write_bytes(f.read_bytes()[:100])
    like = {"like_params": params, "like_state": optim.Adam().init(params, model.manifolds())}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"ckpt-000000001.*damaged.*params\.npz"):
            load_checkpoint(ckpt, **like)
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_checkpoint_directory_of_the_former_layout_is_refused_clearly(xp, device, tmp_path):
    """The former three-file layout (params.npz, opt_state.npz, meta.json side by side, no manifest) cannot
    be verified: one ValueError saying so and how to read its files."""
    model = ClassificationTransformer(4, 2, 3, n_heads=2, n_layers=1)
    params = model.init(0, xp=xp, dtype="float64", device=device)
    state = optim.Adam().init(params, model.manifolds())
    optim.save_state(tmp_path / "opt_state.npz", state)
    (tmp_path / "params.npz").write_bytes(b"PK")
    (tmp_path / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=r"older geoarray.*cannot be verified.*load_state"):
        load_checkpoint(tmp_path, like_params=params, like_state=state)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no checkpoint"):
        load_checkpoint(tmp_path / "empty", like_params=params, like_state=state)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing", like_params=params, like_state=state)
