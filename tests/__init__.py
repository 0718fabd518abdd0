"""devtag's tests: a package, so test folders are packages too and their module names never clash."""
