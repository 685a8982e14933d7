/* ff_version.h — the project's version, shared by both programs. */
#ifndef FF_VERSION_H
#define FF_VERSION_H
#define FF_VERSION "0.1.0"
#endif
