//go:build linux

package loop

import (
	"golang.org/x/sys/unix"
)

// An upgraded connection (a WebSocket, after the upstream's 101): bytes
// carried both ways as they come, each side read only while the other
// takes what it was given. An end of one side is passed on as a
// half-close of the other, so that the other direction can finish; it
// ends when both have, or when neither side sent anything for the
// upstream timeout (nginx closes an idle upgraded connection after
// proxy_read_timeout the same way).
type tunnel struct {
	c      *conn
	u      *upConn
	cEOF   bool // the client sent its end
	uEOF   bool // so did the upstream
	cShut  bool // the client was told the upstream's end
	uShut  bool // the upstream was told the client's end
	closed bool
}

// startTunnel carries the connection once the upstream's 101 is sent;
// rest is what the upstream sent after it.
func (r *request) startTunnel(u *upConn, rest []byte) {
	c := r.c
	r.phase = phTunnel
	r.headSent = true
	r.responded(101)
	r.up = nil
	u.r = nil
	// The tunnel's idle timeout is the client connection's (touch): the
	// upstream's own timer, armed for the response, must not fire as if
	// a response were due.
	u.l.wheel.unlink(&u.t)
	if c == nil {
		u.close()
		r.finish(nil)
		return
	}
	c.queue(r.composeHead(&u.resp))
	c.queue(rest)
	c.send()
	t := &tunnel{c: c, u: u}
	u.tun, c.tun = t, t
	c.r = nil
	c.setState(csTunnel)
	r.finish(nil)
	if c.inLen() > 0 {
		// What the client sent after its request goes first.
		u.queueRaw(c.in[c.inOff:])
		c.l.putBuf(c.in)
		c.in, c.inOff = nil, 0
	}
	t.touch()
	u.flush()
	if c.state == csClosed || u.state != upBusy {
		return
	}
	_ = c.l.interest(u.fd, &u.have, wantRead|u.have&wantWrite)
	t.clientWant()
}

// touch moves the tunnel's idle timeout on.
func (t *tunnel) touch() {
	t.c.setRead(t.c.l.s.o.client.Timeout)
}

// fromClient carries what the client sent to the upstream.
func (t *tunnel) fromClient() {
	c, u, l := t.c, t.u, t.c.l
	n, err := read(c.fd, l.rbuf)
	switch {
	case t.stopped(err):
		return
	case n == 0:
		t.cEOF = true
		t.clientWant()
		t.shutUpstream()
		return
	}
	t.touch()
	u.queueRaw(l.rbuf[:n])
	u.flush()
	if !t.closed {
		t.clientWant()
	}
}

// stopped reports whether a read of either side went no further: it
// would block (the loop calls again when it is ready), or it failed, and
// the tunnel is closed.
func (t *tunnel) stopped(err error) bool {
	if err != nil && err != unix.EAGAIN {
		t.close()
	}
	return err != nil
}

// upEvent handles the upstream side.
func (t *tunnel) upEvent(ev uint32) {
	u := t.u
	if ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) != 0 && u.backlog() > 0 {
		u.flush()
		if u.state != upBusy {
			t.close()
			return
		}
		if u.backlog() == 0 {
			t.clientWant()
			t.shutUpstream()
		}
	}
	if ev&(unix.EPOLLIN|unix.EPOLLERR|unix.EPOLLHUP) == 0 || u.have&wantRead == 0 || t.closed {
		return
	}
	c, l := t.c, t.c.l
	n, err := read(u.fd, l.rbuf)
	switch {
	case t.stopped(err):
		return
	case n == 0:
		t.uEOF = true
		_ = l.interest(u.fd, &u.have, u.have&^wantRead)
		t.shutClient()
		return
	}
	t.touch()
	c.write(l.rbuf[:n])
	if c.state == csClosed || c.broken {
		t.close()
		return
	}
	if c.backlog() >= highWater {
		_ = l.interest(u.fd, &u.have, u.have&^wantRead)
	}
}

// clientWant reads the client while the upstream takes its bytes.
func (t *tunnel) clientWant() {
	c := t.c
	want := c.have &^ wantRead
	if !t.cEOF && t.u.backlog() < highWater {
		want |= wantRead
	}
	_ = c.l.interest(c.fd, &c.have, want)
}

// clientDrained: the client took what the upstream sent.
func (t *tunnel) clientDrained() {
	if t.closed {
		return
	}
	u := t.u
	if !t.uEOF && u.have&wantRead == 0 {
		_ = t.c.l.interest(u.fd, &u.have, u.have|wantRead)
	}
	t.shutClient()
}

// shutClient passes the upstream's end on, once its bytes are sent.
func (t *tunnel) shutClient() {
	if !t.uEOF || t.cShut || t.c.outLen() > 0 {
		return
	}
	t.shut(t.c.fd, &t.cShut)
}

// shutUpstream passes the client's end on, once its bytes are sent.
func (t *tunnel) shutUpstream() {
	if !t.cEOF || t.uShut || t.u.backlog() > 0 {
		return
	}
	t.shut(t.u.fd, &t.uShut)
}

// shut shuts fd's writing side and records it in done; the tunnel ends
// once both sides are shut, or when the shutdown fails.
func (t *tunnel) shut(fd int, done *bool) {
	*done = true
	if unix.Shutdown(fd, unix.SHUT_WR) != nil || t.cShut && t.uShut {
		t.close()
	}
}

// expire: neither side sent anything for the upstream timeout.
func (t *tunnel) expire() { t.close() }

// close closes both sides.
func (t *tunnel) close() {
	if t.closed {
		return
	}
	t.closed = true
	t.u.tun = nil
	t.u.close()
	t.c.tun = nil
	t.c.close(nil)
}
