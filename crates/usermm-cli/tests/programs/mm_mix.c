/* A small program for `usermm trace record` to record and the replay to
 * check: anonymous memory touched page by page, MADV_DONTNEED, mprotect,
 * mremap, a thread with its own mapping, a forked child writing to
 * copy-on-write pages, malloc's heap (brk) and a large malloc (mmap). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096UL

static void touch(volatile char *p, size_t len)
{
	for (size_t i = 0; i < len; i += PAGE)
		p[i] = 1;
}

static void *worker(void *arg)
{
	size_t len = 1UL << 20;
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	(void)arg;
	if (p == MAP_FAILED)
		return NULL;
	touch(p, len);
	munmap(p, len / 2);
	return NULL;
}

int main(void)
{
	size_t len = 8UL << 20;
	char *a = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED)
		return 1;
	touch(a, len);
	madvise(a, len / 4, MADV_DONTNEED);
	mprotect(a + len / 2, 4 * PAGE, PROT_READ);
	char *b = mremap(a + len - 64 * PAGE, 64 * PAGE, 256 * PAGE,
			 MREMAP_MAYMOVE);
	if (b != MAP_FAILED)
		touch(b, 256 * PAGE);

	pthread_t t;
	if (pthread_create(&t, NULL, worker, NULL) == 0)
		pthread_join(t, NULL);

	pid_t c = fork();
	if (c == 0) {
		touch(a + len / 4, 32 * PAGE);
		_exit(0);
	}
	if (c > 0)
		waitpid(c, NULL, 0);

	char *small = malloc(64 * 1024);
	if (small)
		memset(small, 1, 64 * 1024);
	char *big = malloc(2UL << 20);
	if (big)
		memset(big, 1, 2UL << 20);
	free(big);
	munmap(a, len / 2);
	return 0;
}
