package prefork

// exampleEngines are the engines of the package's examples (package
// prefork_test), by the payload of the settings they run with: a worker
// of the test binary started by an example runs that example's engine,
// as a program's own workers run its code.
var exampleEngines = map[string]func(*Worker) (Engine, error){}

// RegisterExample makes f the engine of workers whose settings carry
// payload; it returns true, for a package-level declaration.
func RegisterExample(payload string, f func(*Worker) (Engine, error)) bool {
	exampleEngines[payload] = f
	return true
}
