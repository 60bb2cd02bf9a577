"""xgrammar imported without transformers (services/generation/grammar/xgr.py), in fresh interpreters:
the test process itself may already hold transformers or xgrammar."""

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_xgrammar_loads_and_compiles_without_importing_transformers():
    out = _run("""
        import sys
        from services.generation.grammar.xgr import xgrammar
        xgr = xgrammar()
        info = xgr.TokenizerInfo(["a", "b", "{", "}", "</s>"], xgr.VocabType.RAW, stop_token_ids=[4])
        compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar('root ::= "{" "a"* "}"')
        matcher = xgr.GrammarMatcher(compiled)
        assert matcher.accept_token(2) and matcher.accept_token(0) and not matcher.accept_token(1)
        print(sorted(m for m in ("transformers", "tokenizers", "huggingface_hub", "PIL") if m in sys.modules))
        print(xgrammar() is xgr)
    """)
    assert out.splitlines() == ["[]", "True"]


def test_a_later_import_of_transformers_gets_the_real_package():
    out = _run("""
        from services.generation.grammar.xgr import xgrammar
        xgrammar()
        import transformers
        print(hasattr(transformers, "AutoTokenizer"), getattr(transformers, "__mstar_stand_in__", False))
    """)
    assert out.splitlines() == ["True False"]


def test_when_the_stand_in_is_not_enough_xgrammar_is_imported_with_transformers():
    out = _run("""
        import sys
        from services.generation.grammar import xgr as loader
        stand_in = loader._stand_in
        def missing_a_name():
            module = stand_in()
            del module.LogitsProcessor  # as if xgrammar needed a name the stand-in lacks
            return module
        loader._stand_in = missing_a_name
        xgr = loader.xgrammar()
        print(hasattr(xgr, "GrammarCompiler"), "transformers" in sys.modules,
              getattr(sys.modules["transformers"], "__mstar_stand_in__", False))
    """)
    assert out.splitlines() == ["True True False"]


def test_threads_importing_at_once_all_get_the_whole_module():
    out = _run("""
        import sys, threading
        from services.generation.grammar.xgr import xgrammar
        got, start = [], threading.Barrier(4)
        def load():
            start.wait()
            got.append(xgrammar().GrammarCompiler)  # a half-imported module lacks it
        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(len(got), len(set(got)), "transformers" in sys.modules)
    """)
    assert out.splitlines() == ["4 1 False"]
