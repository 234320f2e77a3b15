"""A function that prepares a model (or optimizer, loader) it reads from outside: the prepare's assignment would
make the name local to the whole function and its first read an UnboundLocalError on every rank. The conversion
declares the name `global` (or `nonlocal`) at the top of the function."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from accelkit.convert.codemod import convert_source

GLOBAL_MODEL = textwrap.dedent('''
    """Fit a global model in a function; another function evaluates the same global."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Linear(8, 1)


    def fit(steps):
        X = torch.randn(64, 8)
        Y = X.sum(1, keepdim=True)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8, shuffle=True)
        for x, y in loader:
            loss = nn.functional.mse_loss(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"LOSS loss={loss.item():.6f}")


    def evaluate():
        with torch.no_grad():
            print("EVAL", net(torch.ones(1, 8)).item())


    if __name__ == "__main__":
        fit(2)
        evaluate()
''')


def _function_body(code: str, name: str) -> list[str]:
    lines = code.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    return [line.strip() for line in lines[start + 1:] if line.startswith("    ")]


def test_a_global_model_prepared_in_a_function_is_declared_global_and_runs() -> None:
    result = convert_source(GLOBAL_MODEL, filename="fit.py")
    body = _function_body(result.code, "fit")
    assert body[0] == "global net", body[:3]  # before any read of it; the locals optimizer and loader stay local
    assert "net, optimizer, loader = accelerator.prepare(net, optimizer, loader)" in body
    assert "`global net` added to `fit()`" in result.report.format()
    # the conversion runs (one process): evaluate() reads the prepared global
    proc = subprocess.run([sys.executable, "-c", result.code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count("LOSS") == 8 and "EVAL" in proc.stdout


def test_a_model_of_the_enclosing_function_is_declared_nonlocal() -> None:
    source = textwrap.dedent('''
        import torch
        from torch import nn


        def main():
            model = nn.Linear(4, 1)

            def train():
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                for _ in range(2):
                    loss = model(torch.randn(8, 4)).pow(2).mean()
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()

            train()


        main()
    ''')
    code = convert_source(source, filename="nested.py").code
    assert "nonlocal model" in code, code
    compile(code, "nested.py", "exec")  # nonlocal before any read: no SyntaxError


def test_a_parameter_or_a_local_needs_no_declaration() -> None:
    source = textwrap.dedent('''
        import torch
        from torch import nn


        def fit(net):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            for _ in range(2):
                loss = net(torch.randn(8, 4)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()


        fit(nn.Linear(4, 1))
    ''')
    code = convert_source(source, filename="param.py").code
    assert "global" not in code and "nonlocal" not in code, code
    assert "accelerator.prepare(" in code
