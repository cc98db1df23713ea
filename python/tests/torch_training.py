"""The training-step checks the attnres.torch test files share: a model
built on attnres.torch ops (fast) against the same model in plain PyTorch
(slow), from the same parameters. Imported only by test files that have
already skipped where torch is absent."""

import torch


def rel_err(got, want):
    return ((got.double() - want.double()).norm() / (want.double().norm() + 1e-300)).item()


def check_compiled_step(fast, slow, x, target, backend):
    """torch.compile(fullgraph=True) of forward, loss and backward: no graph
    break, and the loss and every parameter's gradient as plain PyTorch's."""
    torch._dynamo.reset()

    def loss_fn(model, x, target):
        return (model(x) - target).pow(2).mean()

    explanation = torch._dynamo.explain(loss_fn)(fast, x, target)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    # fullgraph=True raises on any graph break; the backward of the compiled
    # graph (AOTAutograd's) calls the attnres backward ops.
    compiled = torch.compile(loss_fn, fullgraph=True, backend=backend)
    loss = compiled(fast, x, target)
    loss.backward()
    want = loss_fn(slow, x, target)
    want.backward()
    assert abs(loss.item() - want.item()) <= 1e-5 * abs(want.item())
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        assert rel_err(p.grad, q.grad) <= 1e-4, name


def check_sgd_steps(fast, slow, x, target, steps=5):
    """A few SGD steps of each model: the losses agree step by step, fall,
    and the parameters end where plain PyTorch's do."""
    opt_fast = torch.optim.SGD(fast.parameters(), lr=0.1)
    opt_slow = torch.optim.SGD(slow.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        pair = []
        for model, opt in ((fast, opt_fast), (slow, opt_slow)):
            opt.zero_grad()
            loss = (model(x) - target).pow(2).mean()
            loss.backward()
            opt.step()
            pair.append(loss.item())
        losses.append(pair)
        assert abs(pair[0] - pair[1]) <= 1e-5 * abs(pair[1]), losses
    assert losses[-1][0] < losses[0][0], "the loss should fall"
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        assert rel_err(p, q) <= 1e-5, name
