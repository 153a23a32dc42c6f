"""The package as `pip install .` lays it out: the CMake "python" component (what
scikit-build-core puts into the wheel, pyproject.toml) installed from this build into a
temporary folder, imported and used from outside the source and build trees; and
pyproject.toml's scikit-build-core settings accepted. The full `pip wheel .` rebuilds the
whole library (docs/design.md, "pip install check", says why ctest does not run it)."""
import os
import subprocess
import sys
import textwrap

import pytest

SOURCE = os.environ.get("PAGELLM_SOURCE_DIR", "")
BINARY = os.environ.get("PAGELLM_BINARY_DIR", "")


@pytest.mark.skipif(not BINARY, reason="PAGELLM_BINARY_DIR not set (run through ctest)")
def test_installed_component_imports_and_generates(tmp_path):
    prefix = tmp_path / "site"
    subprocess.run(["cmake", "--install", BINARY, "--component", "python", "--prefix",
                    str(prefix)], check=True, capture_output=True)
    pkg = prefix / "pagellm"
    assert any(p.name.startswith("_core") for p in pkg.iterdir())
    assert (pkg / "py.typed").exists() and (pkg / "__init__.py").exists()
    tok = pkg / "data" / "qwen3-tokenizer" / "tokenizer.json"
    assert tok.is_file() and not tok.is_symlink() and tok.stat().st_size > 1_000_000
    script = textwrap.dedent(f"""
        import os, sys
        import pagellm
        assert pagellm.__file__.startswith({str(prefix)!r}), pagellm.__file__
        assert "torch" not in sys.modules
        model = pagellm.make_model({str(tmp_path / "m")!r})
        llm = pagellm.LLM(model, backend="cpu", kv_cache_gb=0.02)
        out = llm.generate(["installed"], pagellm.SamplingParams(max_tokens=5, seed=1), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 5
        print("ok", pagellm.__version__)
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(prefix)
    res = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok 0.1.0")


@pytest.mark.skipif(not SOURCE, reason="PAGELLM_SOURCE_DIR not set (run through ctest)")
def test_pyproject_is_accepted_by_scikit_build_core(tmp_path):
    pytest.importorskip("scikit_build_core")
    script = textwrap.dedent(f"""
        import os
        os.chdir({SOURCE!r})
        from scikit_build_core.build import prepare_metadata_for_build_wheel
        print(prepare_metadata_for_build_wheel({str(tmp_path)!r}))
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    meta = (tmp_path / res.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "Name: pagellm" in meta and "Version: 0.1.0" in meta


@pytest.mark.skipif(not SOURCE, reason="PAGELLM_SOURCE_DIR not set (run through ctest)")
def test_core_stub_is_current(tmp_path):
    """python/pagellm/_core.pyi is nanobind.stubgen's output for this build (regenerate:
    PYTHONPATH=build/python python3 -m nanobind.stubgen -m pagellm._core -o
    python/pagellm/_core.pyi)."""
    pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_core.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "pagellm._core",
                    "-o", str(out)], check=True)

    def lines(path):  # has_cuda's value is the build's, not the API's
        return [line for line in open(path).read().splitlines() if not line.startswith("has_cuda")]

    assert lines(out) == lines(os.path.join(SOURCE, "python", "pagellm", "_core.pyi"))
