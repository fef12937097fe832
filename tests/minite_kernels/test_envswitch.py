import pytest

from minite_kernels.envswitch import EnvChoice


def test_env_choice_default_parse_and_error(monkeypatch):
    sw = EnvChoice("MINITE_TEST_SWITCH", ("fast", "safe"), default="safe")
    monkeypatch.delenv("MINITE_TEST_SWITCH", raising=False)
    assert sw() == "safe"
    monkeypatch.setenv("MINITE_TEST_SWITCH", " Fast ")
    assert sw() == "fast" and sw() == "fast"  # second read from the memo
    monkeypatch.setenv("MINITE_TEST_SWITCH", "slow")
    with pytest.raises(
        ValueError, match=r"MINITE_TEST_SWITCH='slow' is not valid; choose one of \['fast', 'safe'\]"
    ):
        sw()
    monkeypatch.setenv("MINITE_TEST_SWITCH", "safe")  # a bad value is not remembered
    assert sw() == "safe"


def test_env_choice_rejects_a_default_outside_the_choices():
    with pytest.raises(ValueError, match="default 'x' is not one of"):
        EnvChoice("MINITE_TEST_SWITCH", ("a", "b"), default="x")


def test_env_choice_sees_every_way_of_changing_the_environment(monkeypatch):
    import os

    sw = EnvChoice("MINITE_TEST_SWITCH", ("fast", "safe"), default="safe")
    monkeypatch.delenv("MINITE_TEST_SWITCH", raising=False)
    assert sw() == "safe"
    os.environ["MINITE_TEST_SWITCH"] = "fast"
    try:
        assert sw() == "fast"
        os.environ.update({"MINITE_TEST_SWITCH": "SAFE"})
        assert sw() == "safe"
    finally:
        del os.environ["MINITE_TEST_SWITCH"]
    assert sw() == "safe"
    os.environ.setdefault("MINITE_TEST_SWITCH", "fast")
    assert sw() == "fast"
    os.environ.pop("MINITE_TEST_SWITCH")
    assert sw() == "safe"


def test_env_choice_falls_back_to_a_plain_mapping(monkeypatch):
    """Where ``os.environ`` has no backing dict (a replaced mapping), ``os.environ.get`` is used."""
    import os

    sw = EnvChoice("MINITE_TEST_SWITCH", ("fast", "safe"), default="safe")
    monkeypatch.setattr(os, "environ", {"MINITE_TEST_SWITCH": "fast"})
    assert sw() == "fast"
    os.environ["MINITE_TEST_SWITCH"] = "safe"
    assert sw() == "safe"
