"""tests/python/checks.py: the checks the Python tests share that need no
torch (test_binding_input.py runs without it): fail, and expect (a call
raises ferry.Error with a given status and words in its message)."""
import sys


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def expect(fn, status, *words):
    import ferry
    try:
        fn()
    except ferry.Error as e:
        print("raised:", e)
        if e.status != status:
            fail("status %s, expected %s" % (ferry.status_name(e.status),
                                              ferry.status_name(status)))
        for w in words:
            if w not in e.message:
                fail("message %r does not name %r" % (e.message, w))
        return
    fail("no ferry.Error from %s" % getattr(fn, "__name__", fn))
