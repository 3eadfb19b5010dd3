"""Evaluation: test checks, the shared historical review, blind judging, reports."""
