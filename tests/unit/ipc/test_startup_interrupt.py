"""A start-up race in this process (segment.attach_unless_gone): a child that attaches the
ring after the trainer already unlinked it exits quietly, while the same failure with the
trainer alive is raised. (Ctrl-C at any moment of a real start-up:
tests/loader/test_startup_interrupt.py.)
"""
import pytest


def test_attach_after_the_trainer_is_gone_is_quiet():
    """The segment is unlinked by the trainer only after it closed the alive pipe: a child
    attaching too late exits quietly; the same failure with the trainer alive is raised."""
    from shmloader.ipc import ring as ringmod
    from shmloader.ipc import segment as segmod

    layout = ringmod.RingLayout(n_slots=2, window=8, n_workers=1)
    missing = segmod.new_name()
    assert segmod.attach_unless_gone(missing, layout, lambda: True) is None
    with pytest.raises(FileNotFoundError):
        segmod.attach_unless_gone(missing, layout, lambda: False)
    segment, ring = segmod.create(layout)
    try:
        attached = segmod.attach_unless_gone(segment.name, layout, lambda: True)
        assert attached.ring.header[2] == 2
        attached.close()
    finally:
        ring.release_views()
        segment.unlink()
