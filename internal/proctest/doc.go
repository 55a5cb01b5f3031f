// Package proctest runs a test's other processes: the test binary
// re-executed in a named role, and the log of any process the test
// waits on.
//
// A package whose tests need processes lists its roles and hands them
// to [Main] first thing in TestMain; in the test process Main returns,
// in a child it runs the role and exits:
//
//	func TestMain(m *testing.M) {
//		proctest.Main(map[string]proctest.Role{"hammer": hammer})
//		os.Exit(m.Run())
//	}
//
// A test starts a child with [Start]. What the child needs travels as
// JSON in one environment variable ([Child.Spec]); inherited files are fd
// 3, 4, … in the order of [Options.Files] ([Child.File]). The child talks
// back in lines on its stdout ([Child.Say], [Child.Report] for JSON),
// which the test reads with [Proc.Line], [Proc.Expect] and [Proc.Decode];
// the test can send lines to its stdin ([Proc.Send]; [Child.ReadLine],
// [Child.EachLine]). [Child.Ready] is the one ready signal: it says
// "ready", then holds the child at its [Barrier], if it has one, until
// the test releases every child of the barrier at once.
//
// Every wait is bounded and fails with what it waited for. Every process
// and goroutine has an owner: a [Proc] is killed (SIGKILL) and waited for
// at the end of its test unless it has exited; a [Log] stops following its
// stream at the end of its test. A child's own children are the role's
// business.
//
// [Log] collects lines (or records a test hands it) and lets a test wait
// for one: [Log.WaitFor] from an index, with a timeout and a match.
// [Leaked], after m.Run, fails a package whose code left a goroutine
// running.
package proctest
