"""rq's job data inflated with a cap (common/protocol/jobdata.py): a small job in one call, the same answer as the
stepwise path for every kind of bytes, a bomb refused."""

from __future__ import annotations

import zlib

import pytest

from embedfleet.common.errors import DecodeError
from embedfleet.common.protocol.jobdata import inflate

SMALL = zlib.compress(b"a short job" * 20)
CASES = {"zlib": SMALL, "zlib and junk after it": SMALL + b"junk", "cut short": SMALL[:-6], "not zlib": b"\x93plain",
         "empty": b""}


@pytest.mark.parametrize("name", CASES)
def test_one_call_answers_as_the_capped_path(name):
    data = CASES[name]
    if data:  # a limit just under what one call may make: the stepwise path (it inflates no more than that)
        assert inflate(data) == inflate(data, limit=len(data) * 1032 - 1)
    expected = {"zlib": b"a short job" * 20, "zlib and junk after it": b"a short job" * 20}.get(name, data)
    assert inflate(data) == expected


def test_what_may_pass_the_limit_is_inflated_with_the_cap():
    bomb = zlib.compress(bytes(8 << 20), 9)  # 8 MiB of zeros in ~8 KB
    assert len(bomb) * 1032 > 1 << 20
    with pytest.raises(DecodeError, match="inflates to more than"):
        inflate(bomb, limit=1 << 20)
    assert inflate(bomb) == bytes(8 << 20)  # within the default cap


def test_small_data_goes_as_it_is_and_is_read_without_zlib(monkeypatch):
    from embedfleet.common.protocol import jobdata

    small, large = b"\x94" + b"s" * (jobdata.COMPRESS_ABOVE - 1), b"\x94" + b"l" * jobdata.COMPRESS_ABOVE
    assert jobdata.deflate(small) is small  # rq reads either (Job.restore: zlib, or the bytes as they are)
    assert zlib.decompress(jobdata.deflate(large)) == large
    for level in range(10):  # every zlib stream passes the header check, whatever its level
        assert jobdata._zlib_header(zlib.compress(large, level))

    def no_zlib(*_):
        raise AssertionError("zlib called for data with no zlib header")

    monkeypatch.setattr(jobdata.zlib, "decompress", no_zlib)
    assert inflate(small) is small


@pytest.mark.parametrize("func", ["worker.jobs.embed", "embedfleet.worker.jobs.embed"])
def test_a_worker_serves_the_job_function_under_either_name(func):
    """Producers write the wire name of 0.1 (jobdata.JOB_FUNC); a worker takes the module's own name too, so either
    side can be upgraded first."""
    from embedfleet.common.protocol.jobdata import deflate
    from embedfleet.common.request import EmbedRequest
    from embedfleet.common.serializer import MsgpackSerializer
    from embedfleet.worker.serving.jobdata import decode_job

    request = EmbedRequest(model="m", inputs=["a text"])
    data = deflate(MsgpackSerializer.dumps([func, None, [request.encode()], {}]))
    assert decode_job(request.id, data, "m").inputs == ["a text"]
    wrong = deflate(MsgpackSerializer.dumps(["os.system", None, [request.encode()], {}]))
    with pytest.raises(DecodeError, match="this queue only serves 'worker.jobs.embed'"):
        decode_job(request.id, wrong, "m")
