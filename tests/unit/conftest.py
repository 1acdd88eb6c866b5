"""The unit tier runs without Spark: a test here that asks for the session is a misfiled test."""
import pytest


@pytest.fixture(scope="session")
def spark():
    pytest.fail("tests/unit runs without a SparkSession; move this test to tests/spark")
