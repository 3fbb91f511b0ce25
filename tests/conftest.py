"""pytest's header names the GPU backend the GPU tests will use, or why there is none (once,
rather than in every skipped test's reason)."""


def pytest_report_header(config):
    try:
        from zyfa_runtime.driver import get_driver
        d = get_driver()
        return f"zyfa GPU backend: {d.name}, {d.device_count()} device(s)"
    except Exception as e:  # no library, no device
        return f"zyfa GPU backend: none, GPU tests are skipped ({e})"
