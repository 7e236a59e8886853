"""Orthogonal adapters for pretrained models: geoarray.torch.adapters on tiny Hugging Face models.

Properties, each with its tolerance (float32 models built from configs, no downloads):
* identity start: the adapted model's output equals the untouched model's to 1e-6, and only the R's train;
* the forward pass equals base(x · blockdiag(R)) (input side) or base(x) · blockdiag(R) (output side) with
  the dense block-diagonal matrix, to 1e-5, for nn.Linear and GPT-2's transposed Conv1D;
* R stays orthonormal, max|RᵀR − I| ≤ 1e-5, after steps of gt.Adam and gt.ManifoldMuon at several lrs;
* merge: state_dict keys equal the base model's, outputs equal the adapted model's to 1e-5, and
  save_pretrained → from_pretrained of the original class loads with no missing or unexpected keys;
  unmerge restores the base weights to 1e-6;
* adapter_state_dict → safetensors → load_adapter_state_dict is bit-exact;
* every error names the module or argument, and leaves the model unchanged;
* PEFT: to_peft_state_dict + peft_config reproduce the adapted model in PEFT to 1e-5; from_peft_state_dict
  of that gives the R's back to 1e-5; a Cayley–Neumann adapter comes back orthogonal with a warning.
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.usefixtures("torch_only")

ORTHO_TOL = 1e-5  # float32: the bound on max|RᵀR − I|


@pytest.fixture
def transformers():
    return pytest.importorskip("transformers", reason="tiny BERT/GPT-2 models need transformers ('geoarray-ml[hf]')")


@pytest.fixture
def peft():
    return pytest.importorskip("peft", reason="the PEFT conversion needs peft ('geoarray-ml[hf]')")


@pytest.fixture
def adapters(gt):
    from geoarray.torch import adapters

    return adapters


def _bert(transformers, torch, *, classifier: bool = False):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
        max_position_embeddings=16, num_labels=3,
    )  # fmt: skip
    cls = transformers.BertForSequenceClassification if classifier else transformers.BertModel
    return cls(config).eval()


def _gpt2(transformers, torch):
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2Model(config).eval()


def _ids(torch):
    return torch.randint(0, 64, (3, 7), generator=torch.Generator().manual_seed(1))


def _out(model, ids):
    out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _ortho_error(torch, R):
    R = R.detach().double()
    return float((R.mT @ R - torch.eye(R.shape[-1], dtype=R.dtype)).abs().max())


def _turn(torch, adapters_mod, model, scale=0.3, seed=2):
    """Set every R to a rotation well away from I: the Cayley transform of a random skew matrix (det +1,
    no eigenvalue −1, so PEFT's Cayley map reaches it too)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for adapter in adapters_mod._adapters(model).values():
            X = scale * torch.randn(adapter.R.shape, generator=g, dtype=torch.float64)
            Q = X - X.mT
            eye = torch.eye(Q.shape[-1], dtype=Q.dtype)
            adapter.R.copy_(torch.linalg.solve(eye + Q, eye - Q))


@pytest.mark.parametrize("side", ["input", "output"])
@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_identity_start_leaves_the_output_unchanged_and_trains_only_R(torch, gt, transformers, adapters, arch, side):
    base = _bert(transformers, torch) if arch == "bert" else _gpt2(transformers, torch)
    targets = ["query", "value"] if arch == "bert" else ["c_attn", "c_proj"]
    ids = _ids(torch)
    expected = _out(base, ids)
    model = adapters.orthogonal(copy.deepcopy(base), targets, block_size=8, side=side)
    assert (_out(model, ids) - expected).abs().max() <= 1e-6
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(".R") for n in trainable), trainable
    for n, p in model.named_parameters():
        if n.endswith(".R"):
            assert isinstance(p, gt.ManifoldParameter) and p.shape[-2:] == (8, 8)
            assert torch.equal(p.detach(), torch.eye(8).expand_as(p))


@pytest.mark.parametrize("side", ["input", "output"])
@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_forward_equals_the_dense_block_diagonal_formula(torch, transformers, adapters, arch, side):
    base = _bert(transformers, torch) if arch == "bert" else _gpt2(transformers, torch)
    name = "encoder.layer.0.attention.self.query" if arch == "bert" else "h.0.attn.c_attn"
    model = adapters.orthogonal(copy.deepcopy(base), [name], block_size=8, side=side)
    _turn(torch, adapters, model)
    layer, original = model.get_submodule(name), base.get_submodule(name)
    B = torch.block_diag(*layer.R.detach())
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    dense = original(x @ B) if side == "input" else original(x) @ B
    assert (layer(x) - dense).abs().max() <= 1e-5


@pytest.mark.parametrize("lr", [1e-3, 1e-2, 1e-1])
@pytest.mark.parametrize("method", ["Adam", "ManifoldMuon"])
def test_R_stays_orthonormal_under_geoarray_optimizers(torch, gt, transformers, adapters, method, lr):
    model = adapters.orthogonal(
        _bert(transformers, torch, classifier=True), ["query", "value"], n_blocks=4, trainable_modules=["classifier"]
    )
    R = [p for n, p in model.named_parameters() if n.endswith(".R")]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith(".R")]
    assert rest, "trainable_modules keeps the classifier trainable"
    opt = getattr(gt, method)(R, lr=lr)
    ids, labels = _ids(torch), torch.tensor([0, 1, 2])
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(_out(model, ids), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
    moved = max(float((p.detach() - torch.eye(8)).abs().max()) for p in R)
    assert moved > lr / 10, "the steps moved R away from the identity"
    assert max(_ortho_error(torch, p) for p in R) <= ORTHO_TOL


def test_merge_gives_the_base_keys_and_loads_with_from_pretrained(torch, transformers, adapters, tmp_path):
    base = _bert(transformers, torch)
    ids = _ids(torch)
    model = adapters.orthogonal(copy.deepcopy(base), ["query", "value", "dense"], block_size=8)
    _turn(torch, adapters, model)
    adapted = _out(model, ids)
    assert "encoder.layer.0.attention.self.query.R" in model.state_dict()
    merged = adapters.merge(model)
    assert merged is model and list(merged.state_dict()) == list(base.state_dict())
    assert (_out(merged, ids) - adapted).abs().max() <= 1e-5
    merged.save_pretrained(tmp_path)
    loaded, info = transformers.BertModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert (_out(loaded.eval(), ids) - adapted).abs().max() <= 1e-5


@pytest.mark.parametrize("side", ["input", "output"])
def test_unmerge_restores_the_base_weights(torch, transformers, adapters, side):
    for base, targets in ((_bert(transformers, torch), ["query", "dense"]), (_gpt2(transformers, torch), ["c_attn"])):
        ids = _ids(torch)
        model = adapters.orthogonal(copy.deepcopy(base), targets, block_size=8, side=side)
        _turn(torch, adapters, model)
        adapted = _out(model, ids)
        R = adapters.adapter_state_dict(model)
        kept = {k: v.clone() for k, v in R.items()}
        adapters.unmerge(adapters.merge(model))
        assert set(adapters.adapter_state_dict(model)) == set(R), "the adapters are back"
        for name, p in base.named_parameters():
            q = model.get_submodule(name.rpartition(".")[0])
            q = getattr(q, "base_layer", q)
            assert (getattr(q, name.rpartition(".")[2]) - p).abs().max() <= 1e-6, name
        assert all(torch.equal(v, kept[k]) for k, v in adapters.adapter_state_dict(model).items())
        assert (_out(model, ids) - adapted).abs().max() <= 1e-5


def test_adapter_state_dict_round_trips_bit_exactly_through_safetensors(torch, transformers, adapters, tmp_path):
    st = pytest.importorskip("safetensors.torch", reason="the file round trip needs safetensors")
    base = _gpt2(transformers, torch)
    attention = r"h\.\d+\.attn\.c_(attn|proj)"  # a regex, as PEFT's: not the MLP's c_proj
    model = adapters.orthogonal(copy.deepcopy(base), attention, block_size=16)
    _turn(torch, adapters, model)
    sd = adapters.adapter_state_dict(model)
    assert set(sd) == {"h.0.attn.c_attn.R", "h.0.attn.c_proj.R"}
    assert all(type(v) is torch.Tensor and v.is_contiguous() for v in sd.values())
    st.save_file(sd, tmp_path / "adapter.safetensors")
    fresh = adapters.orthogonal(copy.deepcopy(base), attention, block_size=16)
    adapters.load_adapter_state_dict(fresh, st.load_file(tmp_path / "adapter.safetensors"))
    ids = _ids(torch)
    assert all(torch.equal(v, sd[k]) for k, v in adapters.adapter_state_dict(fresh).items())
    assert torch.equal(_out(fresh, ids), _out(model, ids))


def _snapshot(model):
    return [(n, p.requires_grad, p.detach().clone()) for n, p in model.named_parameters()]


def _unchanged(torch, before, model):
    after = _snapshot(model)
    return [(n, g) for n, g, _ in before] == [(n, g) for n, g, _ in after] and all(
        torch.equal(a, b) for (_, _, a), (_, _, b) in zip(before, after, strict=True)
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"target_modules": ["qkv"], "block_size": 8}, ValueError, r"target_modules=\['qkv'\] matches no module"),
        ({"target_modules": ["query"], "block_size": 5}, ValueError, r"'encoder\.layer\.0\.attention\.self\.query'"
                                                                     r" has input width 32, which block_size=5"),
        ({"target_modules": ["intermediate.dense"], "block_size": 32, "side": "output"}, ValueError,
         r"'encoder\.layer\.0\.intermediate\.dense' has output width 48"),
        ({"target_modules": ["output.dense"], "block_size": 32}, ValueError, r"'encoder\.layer\.0\.output\.dense'"
                                                                             r" has input width 48"),
        ({"target_modules": ["attention.self"], "block_size": 8}, TypeError, r"'encoder\.layer\.0\.attention\.self'"
                                                                             r", a BertSelfAttention, which is not"),
        ({"target_modules": ["query"], "block_size": 8, "n_blocks": 4}, ValueError, "exactly one of block_size"),
        ({"target_modules": ["query"]}, ValueError, "exactly one of block_size and n_blocks"),
        ({"target_modules": ["query"], "n_blocks": 32}, ValueError, r"blocks of size 1"),
        ({"target_modules": ["query"], "block_size": 8, "side": "left"}, ValueError, "side must be 'input' or"),
        ({"target_modules": ["query"], "block_size": 0}, ValueError, "block_size must be a positive int, got 0"),
        ({"target_modules": "query(", "block_size": 8}, ValueError, "is not a regular expression"),
        ({"target_modules": 3, "block_size": 8}, TypeError, "target_modules must be"),
    ],
    ids=["no-match", "indivisible", "output-side", "indivisible-48", "not-linear", "both", "neither",
         "size-1", "side", "zero", "bad-regex", "not-a-list"],
)  # fmt: skip
def test_orthogonal_errors_name_the_module_and_change_nothing(torch, transformers, adapters, kwargs, error, message):
    model = _bert(transformers, torch)
    before = _snapshot(model)
    with pytest.raises(error, match=message) as info:
        adapters.orthogonal(model, **kwargs)
    assert "\n" not in str(info.value), "one line"
    assert _unchanged(torch, before, model), "the model changed before the error"


def test_merge_unmerge_and_loading_errors(torch, transformers, adapters):
    base = _bert(transformers, torch)
    with pytest.raises(ValueError, match="has no orthogonal adapters; add them with orthogonal"):
        adapters.merge(copy.deepcopy(base))
    with pytest.raises(ValueError, match="unmerge: BertModel holds no adapters merged by merge"):
        adapters.unmerge(copy.deepcopy(base))
    with pytest.raises(ValueError, match="load_adapter_state_dict: BertModel has no orthogonal adapters"):
        adapters.load_adapter_state_dict(copy.deepcopy(base), {})
    model = adapters.orthogonal(copy.deepcopy(base), ["query"], block_size=8)
    with pytest.raises(ValueError, match=r"'encoder\.layer\.0\.attention\.self\.query' already has an orthogonal"):
        adapters.orthogonal(model, ["query"], block_size=8)
    sd = {k: v.clone() for k, v in adapters.adapter_state_dict(model).items()}
    key = next(iter(sd))
    with pytest.raises(ValueError, match=r"missing \['encoder.layer.0.attention.self.query.R'\], unexpected \['x.R'\]"):
        adapters.load_adapter_state_dict(model, {"x.R": sd[key]})
    with pytest.raises(ValueError, match=r"has shape \(2, 16, 16\), the model's adapter \(4, 8, 8\)"):
        adapters.load_adapter_state_dict(model, {key: torch.eye(16).expand(2, 16, 16)})
    with pytest.raises(ValueError, match=r"is not orthogonal \(max\|RᵀR − I\| = 3\)"):
        adapters.load_adapter_state_dict(model, {key: 2 * sd[key]})
    assert torch.equal(adapters.adapter_state_dict(model)[key], sd[key]), "a refused load changed nothing"
    adapters.merge(model)
    with pytest.raises(ValueError, match="merged already; unmerge"):
        adapters.merge(model)
    with pytest.raises(ValueError, match=r"no orthogonal adapters \(they are merged: unmerge\(model\) first\)"):
        adapters.adapter_state_dict(model)


def test_conversion_to_and_from_peft_is_exact(torch, transformers, peft, adapters):
    base = _bert(transformers, torch)
    ids = _ids(torch)
    model = adapters.orthogonal(copy.deepcopy(base), ["query", "value"], block_size=8)
    _turn(torch, adapters, model)
    ours = _out(model, ids)
    config = adapters.peft_config(model)
    assert config.oft_block_size == 8 and config.use_cayley_neumann is False
    peft_model = peft.get_peft_model(copy.deepcopy(base), config)
    loaded = peft.set_peft_model_state_dict(peft_model, adapters.to_peft_state_dict(model))
    assert not loaded.unexpected_keys and not [k for k in loaded.missing_keys if "oft_R" in k]
    assert (_out(peft_model, ids) - ours).abs().max() <= 1e-5
    back = adapters.from_peft_state_dict(peft.get_peft_model_state_dict(peft_model), config)
    sd = adapters.adapter_state_dict(model)
    assert set(back) == set(sd) and all((back[k] - sd[k]).abs().max() <= 1e-5 for k in sd)
    live = adapters.from_peft_state_dict(peft_model.state_dict(), peft_model.peft_config["default"])
    assert set(live) == set(sd)


def test_peft_cayley_neumann_adapters_come_back_orthogonal_with_a_warning(torch, transformers, peft, adapters):
    base = _bert(transformers, torch)
    ids = _ids(torch)
    config = peft.OFTConfig(target_modules=["query"], oft_block_size=8, r=0, init_weights=False)
    assert config.use_cayley_neumann, "PEFT's default is the truncated series"
    torch.manual_seed(4)
    peft_model = peft.get_peft_model(copy.deepcopy(base), config)
    with pytest.warns(UserWarning, match=r"Cayley–Neumann blocks of .*query.* are not orthogonal"):
        sd = adapters.from_peft_state_dict(peft.get_peft_model_state_dict(peft_model), config)
    model = adapters.orthogonal(copy.deepcopy(base), ["query"], block_size=8)
    adapters.load_adapter_state_dict(model, sd)
    assert max(_ortho_error(torch, v) for v in sd.values()) <= ORTHO_TOL
    # small coordinates (std 0.1): the series is near orthogonal, so the models stay close
    assert (_out(peft_model, ids) - _out(model, ids)).abs().max() <= 0.1


def test_peft_conversion_errors(torch, transformers, peft, adapters):
    base = _bert(transformers, torch)
    out_side = adapters.orthogonal(copy.deepcopy(base), ["query"], block_size=8, side="output")
    with pytest.raises(ValueError, match=r"'encoder\.layer\.0\.attention\.self\.query' has side='output'"):
        adapters.to_peft_state_dict(out_side)
    flipped = adapters.orthogonal(copy.deepcopy(base), ["query"], block_size=8)
    with torch.no_grad():
        flipped.get_submodule("encoder.layer.0.attention.self.query").R[1] = -torch.eye(8)
    with pytest.raises(ValueError, match=r"block 1 of '.*query' has an eigenvalue at −1"):
        adapters.to_peft_state_dict(flipped)
    with pytest.raises(ValueError, match="block_share=True"):
        adapters.from_peft_state_dict({}, {"block_share": True})
    with pytest.raises(ValueError, match="no OFT blocks"):
        adapters.from_peft_state_dict({"classifier.weight": torch.zeros(2, 2)}, {"use_cayley_neumann": False})
    with pytest.raises(ValueError, match=r"'encoder\.layer\.0\.attention\.self\.query' has side='output'"):
        adapters.peft_config(out_side)
    mixed = adapters.orthogonal(copy.deepcopy(base), ["query", "output.dense"], n_blocks=2)  # blocks of 16 and 24
    assert adapters.peft_config(mixed).r == 2, "one block count for all: PEFT's r"
    uneven = adapters.orthogonal(copy.deepcopy(base), {"query", "value"}, block_size=8)
    adapters.orthogonal(uneven, ["intermediate.dense"], block_size=16)
    with pytest.raises(ValueError, match=r"block sizes \[8, 16\] and block counts \[2, 4\]"):
        adapters.peft_config(uneven)


def test_the_module_imports_neither_transformers_nor_peft_at_load_time(adapters):
    """Conv1D is recognised by its class's name and home, peft is imported inside peft_config only: the
    module's top-level imports (checked in its source; a fresh interpreter would cost seconds) name neither,
    so geoarray.torch.adapters imports where the hf extra is not installed."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(adapters.__file__).read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
    assert not {m.split(".")[0] for m in names} & {"transformers", "peft"}, names
