package core

// SetTestHook sets testHook for a test, until it ends.
func SetTestHook(cleanup func(func()), hook func(stage string)) {
	testHook = hook
	cleanup(func() { testHook = nil })
}
