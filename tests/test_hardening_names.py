"""Actor names: a duplicate raises ValueError at .remote(); an empty name is refused up front."""

from __future__ import annotations

import pytest
from helpers_modules.remote_defs import Counter

import ddlf_actors as ddlf
from ddlf_actors.runtime.wire.rpc import RemoteRpcError


def test_duplicate_name_raises_value_error_at_remote(cluster):
    first = Counter.options(name="taken").remote(1)
    assert ddlf.get(first.read.remote(), timeout=20) == 1
    with pytest.raises(ValueError, match="'taken' already exists") as info:
        Counter.options(name="taken").remote(2)
    # Before the fix the head's ValueError arrived wrapped, as a RemoteRpcError with a
    # server-side traceback in its message.
    assert not isinstance(info.value, RemoteRpcError)
    assert "get_actor" in str(info.value) and "Traceback" not in str(info.value)
    assert ddlf.get(ddlf.get_actor("taken").read.remote(), timeout=20) == 1


@pytest.mark.parametrize("bad", ["", 7])
def test_empty_or_non_string_name_is_refused_up_front(bad):
    """No cluster needed: the options are checked where they are given."""
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        Counter.options(name=bad)
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        ddlf.remote(name=bad)(type("Named", (), {}))

    @ddlf.remote
    def f():
        return 1

    with pytest.raises(ValueError, match="name must be a non-empty string"):
        f.options(name=bad)
