"""The progress bar moved by rank 0's reports."""

import tqdm.auto

from labutils.core.progress import rank_progress


class FakeBar:
    def __init__(self, total, **kwargs):
        self.total, self.n, self.closed, self.kwargs = total, 0, False, kwargs

    def update(self, k):
        self.n += k

    def close(self):
        self.closed = True


def test_bar_follows_rank_zero_and_closes(monkeypatch):
    bars = []
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda **kw: bars.append(FakeBar(**kw)) or bars[-1])
    with rank_progress(4, "sizes", unit="size") as on_report:
        on_report(0, {"done": 2})
        on_report(1, {"done": 4})  # another rank: ignored
        on_report(0, {"stage": "warm-up"})  # no count: ignored
        assert (bars[0].n, bars[0].total) == (2, 4)
        on_report(0, {"done": 3, "of": 6})
    assert (bars[0].n, bars[0].total, bars[0].closed) == (3, 6, True)
    assert bars[0].kwargs["unit"] == "size"


def test_disabled_bar_gives_no_callback_and_errors_still_close(monkeypatch):
    bars = []
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda **kw: bars.append(FakeBar(**kw)) or bars[-1])
    with rank_progress(4, "sizes", enabled=False) as on_report:
        assert on_report is None
    assert bars == []
    try:
        with rank_progress(4, "sizes"):
            raise RuntimeError("rank 1 failed")
    except RuntimeError:
        pass
    assert bars[0].closed
