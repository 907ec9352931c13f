"""Fixed prompts for benchmarks, so every run (and every framework) decodes the same inputs."""

BENCH_PROMPTS = (
    "Explain how a hash map works, step by step.",
    "Write a Python function that checks whether a string is a palindrome.",
    "What are the main causes of the seasons on Earth?",
    "Give three tips for writing clear technical documentation.",
    "Summarize the plot of a detective story in five sentences.",
    "How do I sort a list of dictionaries by a key in Python?",
    "Describe the water cycle to a ten-year-old.",
    "List the pros and cons of remote work.",
)
