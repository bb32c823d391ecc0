"""Schedule-free optimizers: stepping in eval mode raises; the fit loop evaluates in eval mode."""

from __future__ import annotations

import pytest
import torch
from schedulefree import AdamWScheduleFree

from models import build_model
from tests.helpers import fit_settings, optimizer
from training.app.schema import group_config
from training.engine.batches import DeviceData
from training.engine.fit import Member, TrainData, cross_entropy_sum, eval_mode, fit, fit_temperature


def _setup() -> tuple[torch.nn.Module, AdamWScheduleFree, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = build_model(group_config("arch", "mlp", width=32, depth=1, base_width=32), (1, 4, 4), 3)
    opt = optimizer(model, lr=1e-2, beta1=0.9)
    x, y = torch.randn(64, 1, 4, 4), torch.randint(0, 3, (64,))
    return model, opt, x, y


def test_step_in_eval_mode_and_evaluation_in_train_mode_raise() -> None:
    model, opt, x, y = _setup()
    model.train()
    with pytest.raises(RuntimeError, match="eval mode"):
        cross_entropy_sum(model, x, y)
    opt.eval()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    with pytest.raises(Exception, match="train mode"):
        opt.step()


def test_fit_validates_with_averaged_weights() -> None:
    """Validation losses in the curve are those of the eval-mode (averaged) weights, not the train ones."""
    model, opt, x, y = _setup()
    cfg = fit_settings(batch_size=16, patience=50, max_epochs=5, progress=False)
    res = fit(Member(model, opt, torch.arange(len(y)), torch.Generator().manual_seed(0), cfg),
              TrainData(DeviceData(x, x.device, storage="float32"), y, x, y))
    assert not model.training and not opt.param_groups[0]["train_mode"]
    loss_eval = cross_entropy_sum(model, x, y) / len(y)
    assert loss_eval == pytest.approx(res.best_val_loss, rel=1e-6)
    # The train-mode weights (y sequence) give a different loss: evaluating them would be the paper's bug.
    opt.train()
    model.eval()
    with torch.no_grad():
        loss_train_weights = float(torch.nn.functional.cross_entropy(model(x).double(), y))
    assert abs(loss_train_weights - loss_eval) > 1e-6
    with eval_mode(model, opt):
        assert not model.training


def test_temperature_fit_recovers_a_known_scale() -> None:
    """Logits that are 3x too confident: the fitted temperature undoes it (close to 3)."""
    torch.manual_seed(0)
    x = torch.randn(4000, 5)
    y = torch.distributions.Categorical(logits=x).sample()
    class Times3(torch.nn.Module):
        def forward(self, v: torch.Tensor) -> torch.Tensor:
            return 3 * v

    m = Times3().eval()
    assert fit_temperature(m, x, y) == pytest.approx(3.0, rel=0.1)
