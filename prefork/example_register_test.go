package prefork_test

import "github.com/preforkd/preforkd/prefork"

// The example's workers run its engine (see export_test.go).
var _ = prefork.RegisterExample(`{"login_limit":3}`, newEngine)
