"""Speech: audio features (`frontend_utils`) and test helpers (`test_utils`)."""
