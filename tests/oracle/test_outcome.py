"""How an oracle test script ends, for ctest: 1 when a check failed; 77 (SKIP_RETURN_CODE, reported
as Skipped) when every check that ran passed but some could not run on this machine, so a missing
capability never reads as a pass; else 0."""


def exit_status(failures, skipped):
    print(f"{len(failures)} failed")
    if failures:
        return 1
    if skipped:
        print(f"{len(skipped)} skipped (reported to ctest as skipped): " + "; ".join(skipped))
        return 77
    return 0
